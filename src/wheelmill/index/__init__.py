"""The internal wheel index: a static tree per channel that wheelmill writes (store),
renders (pages), checks (verify), serves (serve), mirrors to external indexes (remote),
and tells consumers how to use (consumer)."""
