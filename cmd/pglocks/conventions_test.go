package main_test

import (
	"io"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

// TestConventions pins pglocks' flock(1)-like flags and its exit status per
// cause, with what each case prints: one stderr line at most, none with -q,
// and no WARN line of the library's default logger.
func TestConventions(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	bare := newCLI(t) // a database where nobody ran pglocks migrate
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %s", code, errOut)
	}
	adv := c.hold([]string{"run", "busy"}, waitForStdin)
	ls := c.hold([]string{"run", "--lease", "busy-lease"}, waitForStdin)
	defer func() { adv.stdin.Close(); ls.stdin.Close(); adv.wait(t); ls.wait(t) }()
	dir := t.TempDir()
	notExec := filepath.Join(dir, "script")
	if err := os.WriteFile(notExec, []byte("#!/bin/sh\necho hi\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	const unreachable = "postgres://nobody@127.0.0.1:1/none?connect_timeout=5"
	cases := []struct {
		name   string
		cli    cli
		args   []string
		want   int
		stdout string // a substring stdout must have ("" : must be empty)
		stderr string // a substring of the one stderr line ("": no stderr at all)
	}{
		{"Busy", c, []string{"run", "busy", "--", "true"}, 75, "", "server backend pid"},
		{"BusyNonblock", c, []string{"run", "-n", "busy", "--", "true"}, 75, "", "held elsewhere"},
		{"BusyConflictExitCode", c, []string{"run", "-E", "3", "busy", "--", "true"}, 3, "", "held elsewhere"},
		{"BusyConflictExitCodeLong", c, []string{"run", "--conflict-exit-code", "0", "busy", "--", "true"}, 0, "", "held elsewhere"},
		{"BusyQuiet", c, []string{"run", "-q", "busy", "--", "true"}, 75, "", ""},
		{"BusyWaitPlainSeconds", c, []string{"run", "-w", "0.2", "busy", "--", "true"}, 75, "", "gave up after 200ms"},
		{"BusyWaitDuration", c, []string{"run", "--wait", "200ms", "busy", "--", "true"}, 75, "", "gave up after 200ms"},
		{"BusyLease", c, []string{"run", "--lease", "busy-lease", "--", "true"}, 75, "", "holder process pid"},
		{"BusyLeaseQuiet", c, []string{"run", "--quiet", "--lease", "busy-lease", "--", "true"}, 75, "", ""},
		{"CommandNotFound", c, []string{"run", "free", "--", "/nonexistent/cmd"}, 127, "", "not found"},
		{"CommandNotFoundInPath", c, []string{"run", "free", "--", "no-such-command-pglocks"}, 127, "", "not found"},
		{"CommandNotExecutable", c, []string{"run", "free", "--", notExec}, 126, "", "not executable"},
		{"NoLeaseTable", bare, []string{"run", "--lease", "x", "--", "true"}, 78, "", "pglocks migrate"},
		{"Unreachable", cli{t: t, dsn: unreachable}, []string{"run", "x", "--", "true"}, 69, "", "127.0.0.1:1"},
		{"TTLWithoutLease", c, []string{"run", "--ttl", "1m", "x", "--", "true"}, 64, "", "--ttl"},
		{"NonblockAndWait", c, []string{"run", "-n", "-w", "5", "x", "--", "true"}, 64, "", "-n"},
		{"BadWait", c, []string{"run", "-w", "soon", "x", "--", "true"}, 64, "", "soon"},
		{"DSNBeforeCommand", cli{t: t}, []string{"--dsn", c.dsn, "run", "free", "--", "echo", "ran"}, 0, "ran", ""},
		{"DSNBeforeCommandWins", cli{t: t, dsn: unreachable}, []string{"--dsn=" + c.dsn, "run", "free", "--", "true"}, 0, "", ""},
		{"Version", cli{t: t}, []string{"--version"}, 0, "pglocks ", ""},
		{"LeaderFlagAfterName", c, []string{"leader", "handover", "cli", "--to", "two"}, 64, "", "flag --to after NAME: flags come before NAME"},
		{"StatusFlagAfterName", c, []string{"status", "x", "--json"}, 64, "", "flag --json after NAME"},
		{"RunFlagAfterName", c, []string{"run", "x", "--lease", "--", "true"}, 64, "", "flag --lease after NAME"},
		{"RunFlagsOfCMDAreCMDs", c, []string{"run", "free", "--", "echo", "--lease"}, 0, "--lease", ""},
		{"LeaderNoLeader", c, []string{"leader", "resign", "--wait", "1s", "nobody"}, 66, "", "no leader"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			tc.cli.t = t
			out, errOut, code := tc.cli.run(tc.args...)
			if code != tc.want {
				t.Errorf("pglocks %q: status %d, want %d (stderr %q)", tc.args, code, tc.want, errOut)
			}
			if tc.stdout == "" && out != "" || !strings.Contains(out, tc.stdout) {
				t.Errorf("pglocks %q: stdout %q, want %q", tc.args, out, tc.stdout)
			}
			if tc.stderr == "" && errOut != "" ||
				tc.stderr != "" && (!strings.Contains(errOut, tc.stderr) || strings.Count(errOut, "\n") != 1) {
				t.Errorf("pglocks %q: stderr %q, want one line with %q (none if empty)", tc.args, errOut, tc.stderr)
			}
		})
	}
}

// TestHelp checks that every command's --help prints, on stdout, its
// synopsis and the table of exit statuses, and exits 0.
func TestHelp(t *testing.T) {
	t.Parallel()
	c := cli{t: t}
	for _, args := range [][]string{{"--help"}, {"run", "--help"}, {"run", "-h"}, {"status", "--help"},
		{"key", "--help"}, {"migrate", "--help"}, {"break", "--help"}, {"doctor", "--help"}} {
		out, errOut, code := c.run(args...)
		if code != 0 || errOut != "" || !strings.Contains(out, "usage: pglocks") ||
			!strings.Contains(out, "EXIT STATUS") || !strings.Contains(out, "69") {
			t.Errorf("pglocks %q: status %d, stderr %q, stdout:\n%s\nwant the synopsis and the exit statuses on stdout", args, code, errOut, out)
		}
	}
	if out, _, _ := c.run("migrate", "--help"); !strings.Contains(out, "run table") {
		t.Errorf("migrate --help does not say it creates the run table:\n%s", out)
	}
}

// TestRunWaitsThroughOutage: with --wait, a server that refuses (here: a
// port that closes every connection, as a server going down does) is
// tried again until it answers, within the wait; without --wait it is
// 69 at once.
func TestRunWaitsThroughOutage(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	u, err := url.Parse(c.dsn)
	if err != nil {
		t.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	refused := make(chan struct{}, 100) // one per connection closed unanswered
	var up atomic.Bool
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				return
			}
			if !up.Load() {
				conn.Close()
				refused <- struct{}{}
				continue
			}
			go forward(conn, u.Host)
		}
	}()
	down := *u
	down.Host = ln.Addr().String()
	outage := cli{t: t, dsn: down.String()}
	if _, errOut, code := outage.run("run", "x", "--", "true"); code != 69 {
		t.Fatalf("without --wait, a server down: status %d (stderr %q), want 69 at once", code, errOut)
	}
	cmd := outage.command("run", "-w", "60", "x", "--", "echo", "ran")
	var out, errOut strings.Builder
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	for range 3 { // the waiting run tried and was refused, three times
		select {
		case <-refused:
		case <-time.After(time.Minute):
			t.Fatal("the waiting run did not try to connect")
		}
	}
	up.Store(true)
	if err := cmd.Wait(); err != nil || out.String() != "ran\n" {
		t.Fatalf("run -w 60 through an outage: %v, stdout %q, stderr %q; want CMD run once the server answers", err, out.String(), errOut.String())
	}
}

// forward copies between conn and a new connection to addr.
func forward(conn net.Conn, addr string) {
	defer conn.Close()
	up, err := net.Dial("tcp", addr)
	if err != nil {
		return
	}
	defer up.Close()
	go func() { _, _ = io.Copy(up, conn); up.Close() }()
	_, _ = io.Copy(conn, up)
}

// TestRunWaitBoundsSilentServer: a server that accepts connections and
// never answers does not hang pglocks: with -w the wait bounds every
// connect attempt, and the run exits 69 soon after it (it hung until
// killed: each attempt had no deadline and no connect timeout).
func TestRunWaitBoundsSilentServer(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { ln.Close() })
	var held []net.Conn
	go func() {
		for {
			conn, err := ln.Accept()
			if err != nil {
				for _, c := range held {
					c.Close()
				}
				return
			}
			held = append(held, conn) // accepted, never answered
		}
	}()
	c := cli{t: t, dsn: "postgres://postgres@" + ln.Addr().String() + "/postgres?sslmode=disable"}
	start := time.Now()
	_, errOut, code := c.run("run", "-w", "2", "silent", "--", "true")
	took := time.Since(start)
	if code != 69 || took > 20*time.Second {
		t.Fatalf("run -w 2 against a silent server: status %d after %v (stderr %q), want 69 within the wait (and slack)", code, took.Round(time.Millisecond), errOut)
	}
	t.Logf("status 69 after %v", took.Round(time.Millisecond))
}
