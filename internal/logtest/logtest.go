// Package logtest records slog records for tests, and lets a test wait for
// one that matches.
package logtest

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"
)

// Record is one recorded log record: its level, message and attributes
// (values formatted with fmt's %v).
type Record struct {
	Level slog.Level
	Msg   string
	Attrs map[string]string
}

// String formats r on one line.
func (r Record) String() string { return fmt.Sprintf("%v %s %v", r.Level, r.Msg, r.Attrs) }

// Recorder is a slog.Handler that keeps every record, at every level.
type Recorder struct {
	mu      sync.Mutex
	records []Record
	changed chan struct{}
	attrs   []slog.Attr
	root    *Recorder
}

// New returns an empty Recorder and a logger writing to it.
func New() (*Recorder, *slog.Logger) {
	r := &Recorder{changed: make(chan struct{})}
	r.root = r
	return r, slog.New(r)
}

// Enabled reports true for every level.
func (r *Recorder) Enabled(context.Context, slog.Level) bool { return true }

// Handle records rec.
func (r *Recorder) Handle(_ context.Context, rec slog.Record) error {
	out := Record{Level: rec.Level, Msg: rec.Message, Attrs: map[string]string{}}
	for _, a := range r.attrs {
		out.Attrs[a.Key] = a.Value.String()
	}
	rec.Attrs(func(a slog.Attr) bool {
		out.Attrs[a.Key] = a.Value.String()
		return true
	})
	root := r.root
	root.mu.Lock()
	root.records = append(root.records, out)
	close(root.changed)
	root.changed = make(chan struct{})
	root.mu.Unlock()
	return nil
}

// WithAttrs returns a handler adding attrs to every record.
func (r *Recorder) WithAttrs(attrs []slog.Attr) slog.Handler {
	return &Recorder{root: r.root, attrs: append(append([]slog.Attr(nil), r.attrs...), attrs...)}
}

// WithGroup is not supported by the recorder: it returns r.
func (r *Recorder) WithGroup(string) slog.Handler { return r }

// Records returns a copy of the records so far.
func (r *Recorder) Records() []Record {
	r.root.mu.Lock()
	defer r.root.mu.Unlock()
	return append([]Record(nil), r.root.records...)
}

// Wait waits up to d for a record at level with a message containing msg,
// and returns it; ok is false if none came.
func (r *Recorder) Wait(level slog.Level, msg string, d time.Duration) (rec Record, ok bool) {
	deadline := time.NewTimer(d)
	defer deadline.Stop()
	for {
		r.root.mu.Lock()
		for _, x := range r.root.records {
			if x.Level == level && strings.Contains(x.Msg, msg) {
				r.root.mu.Unlock()
				return x, true
			}
		}
		changed := r.root.changed
		r.root.mu.Unlock()
		select {
		case <-changed:
		case <-deadline.C:
			return Record{}, false
		}
	}
}

// SetDefault makes a new Recorder the process's default logger
// (slog.SetDefault) until t ends, then restores the one before, and
// returns it. The default logger is global: call it only from a test that
// does not run in parallel (no t.Parallel), so that no other test logs to
// it meanwhile.
func SetDefault(t testing.TB) *Recorder {
	t.Helper()
	rec, logger := New()
	old := slog.Default()
	slog.SetDefault(logger)
	t.Cleanup(func() { slog.SetDefault(old) })
	return rec
}

// Below returns the records below level whose message starts with prefix.
func (r *Recorder) Below(level slog.Level, prefix string) []Record {
	var out []Record
	for _, x := range r.Records() {
		if x.Level < level && strings.HasPrefix(x.Msg, prefix) {
			out = append(out, x)
		}
	}
	return out
}
