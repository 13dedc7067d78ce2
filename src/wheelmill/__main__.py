from wheelmill.cli import entry

entry()
