"""What a build of a cell leaves behind: its directory's layout and its report, read back."""
