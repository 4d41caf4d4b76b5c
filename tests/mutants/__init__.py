"""The mutation proof: every mutant of the specs is killed by the explorer and by hypothesis."""
