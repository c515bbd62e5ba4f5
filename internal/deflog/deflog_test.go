package deflog_test

import (
	"bytes"
	"log/slog"
	"strings"
	"testing"

	"github.com/pglocks/pglocks/internal/deflog"
)

// setDefault makes a text logger on a buffer the default until t ends.
func setDefault(t *testing.T, level slog.Level) *bytes.Buffer {
	var buf bytes.Buffer
	old := slog.Default()
	slog.SetDefault(slog.New(slog.NewTextHandler(&buf, &slog.HandlerOptions{Level: level})))
	t.Cleanup(func() { slog.SetDefault(old) })
	return &buf
}

// TestOr: a nil logger becomes one that passes Warn and Error, with the
// attributes and groups given to it, to the default logger set at the
// time of each record (a later slog.SetDefault included), and drops
// Debug and Info; a logger given is kept. Not parallel: it sets the
// process's default logger.
func TestOr(t *testing.T) {
	given := slog.New(slog.DiscardHandler)
	if deflog.Or(given) != given {
		t.Error("Or replaced the logger given")
	}
	log := deflog.Or(nil).With("election", "e1").WithGroup("g")
	buf := setDefault(t, slog.LevelDebug) // set after the logger was made
	log.Debug("routine debug")
	log.Info("routine info")
	log.Warn("failing", "err", "refused")
	log.Error("cannot succeed")
	out := buf.String()
	t.Logf("default logger got:\n%s", out)
	for _, want := range []string{"level=WARN msg=failing election=e1 g.err=refused", "level=ERROR msg=\"cannot succeed\""} {
		if !strings.Contains(out, want) {
			t.Errorf("missing %q", want)
		}
	}
	for _, no := range []string{"routine"} {
		if strings.Contains(out, no) {
			t.Errorf("a record below Warn was passed on: %q", no)
		}
	}
	if deflog.Or(nil).Enabled(t.Context(), slog.LevelInfo) {
		t.Error("Info is enabled")
	}
	// The default's own level still applies.
	buf = setDefault(t, slog.LevelError)
	deflog.Or(nil).Warn("below the default's level")
	if buf.Len() != 0 {
		t.Errorf("a Warn passed a default logger at Error: %s", buf)
	}
	// A deflog logger set as the default does not loop.
	old := slog.Default()
	slog.SetDefault(deflog.Or(nil))
	deflog.Or(nil).Warn("no loop")
	slog.SetDefault(old)
}

// wrapper is a handler that passes everything on to another, as a
// program's own handler (a filter, a fan-out) does.
type wrapper struct{ slog.Handler }

func (w wrapper) WithAttrs(attrs []slog.Attr) slog.Handler {
	return wrapper{w.Handler.WithAttrs(attrs)}
}
func (w wrapper) WithGroup(name string) slog.Handler { return wrapper{w.Handler.WithGroup(name)} }

// TestNoLoopThroughAWrapper: a default logger whose handler wraps a deflog
// handler — a program that made its default from a Config's Logger, in a
// handler of its own — does not make a record loop between the two (it
// overflowed the stack): the record that comes back is dropped. Not
// parallel: it sets the process's default logger.
func TestNoLoopThroughAWrapper(t *testing.T) {
	old := slog.Default()
	defer slog.SetDefault(old)
	log := deflog.Or(nil).With("locker", "l1")
	slog.SetDefault(slog.New(wrapper{log.Handler()}))
	done := make(chan bool, 1)
	go func() { // a loop overflows this goroutine's stack, not the test's
		log.Warn("through a wrapper")
		slog.Warn("from the program")
		done <- log.Enabled(t.Context(), slog.LevelWarn)
	}()
	if enabled := <-done; enabled {
		t.Error("Enabled is true where every record would be dropped")
	}
}
