//go:build !linux

package main

import "os/exec"

// guardChild does nothing where the kernel has no parent-death signal: if
// pglocks is killed outright there, CMD runs on without the lock.
func guardChild(*exec.Cmd) {}
