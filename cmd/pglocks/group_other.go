//go:build !unix

package main

import (
	"os"
	"os/exec"
)

// setGroup: no process groups here.
func setGroup(*exec.Cmd) bool { return false }

// signalJob signals CMD (only os.Kill works on Windows).
func signalJob(p *os.Process, _ bool, sig os.Signal) { _ = p.Signal(sig) }

func groupAlive(int) bool { return false }
