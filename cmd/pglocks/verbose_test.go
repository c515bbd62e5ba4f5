package main_test

import (
	"strings"
	"testing"
)

// TestVerbose checks that -v logs the library's events to stderr, and that
// without it stderr stays quiet.
func TestVerbose(t *testing.T) {
	t.Parallel()
	c := newCLI(t)
	_, errOut, code := c.run("-v", "run", "verbose-job", "--", "true")
	if code != 0 || !strings.Contains(errOut, "advisory: acquired") || !strings.Contains(errOut, "key=") || !strings.Contains(errOut, "advisory: released") {
		t.Fatalf("pglocks -v run: status %d, stderr %q; want the acquisition and the release logged", code, errOut)
	}
	if _, errOut, code := c.run("migrate"); code != 0 {
		t.Fatalf("migrate: %d %q", code, errOut)
	}
	_, errOut, code = c.run("--verbose", "run", "--lease", "verbose-lease", "--", "true")
	if code != 0 || !strings.Contains(errOut, "lease: acquired") || !strings.Contains(errOut, "token=") {
		t.Fatalf("pglocks --verbose run --lease: status %d, stderr %q", code, errOut)
	}
	if _, errOut, code := c.run("run", "verbose-job", "--", "true"); code != 0 || errOut != "" {
		t.Fatalf("pglocks run without -v: status %d, stderr %q; want nothing", code, errOut)
	}
}
