package shard_test

// runChild runs a member process when the test binary is started as one.
func runChild() bool { return false }
