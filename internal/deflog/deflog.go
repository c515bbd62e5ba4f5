// Package deflog is the logger of a pglocks Config whose Logger is nil:
// the warnings and errors — a dial or campaign that keeps failing, a
// fallback behind a pooler, a lost lock, lease or term — go to
// slog.Default(), and everything below Warn (acquisitions, releases,
// renewals, elections: routine events) is dropped. A library that is
// silent by default hides exactly the failures its user needs to hear of,
// and one that logs routine events by default floods them: warnings only
// is what reaches a user who configured nothing.
//
// The default logger is looked up at each record, not when the Config is
// made, so a program that calls slog.SetDefault after making its Locker,
// Store or Elector still gets their warnings where it wants them. A
// program whose default handler is, or wraps, such a logger's handler
// (slog.SetDefault(slog.New(locker.Config().Logger.Handler()))) has no
// sink for them: a record that comes back to a deflog handler through the
// default is dropped, marked in its context, rather than loop forever.
package deflog

import (
	"context"
	"log/slog"
)

// Level is the lowest level that the default logger passes on.
const Level = slog.LevelWarn

// Or returns l, or, when l is nil, a logger that passes records at
// [Level] and above to slog.Default().
func Or(l *slog.Logger) *slog.Logger {
	if l != nil {
		return l
	}
	return slog.New(handler{})
}

// handler passes records at Level and above to slog.Default()'s handler,
// with the attributes and groups added to it by With and WithGroup.
type handler struct {
	ops []op
}

// op is one WithAttrs (group == "") or WithGroup call, replayed on the
// default handler at each record.
type op struct {
	group string
	attrs []slog.Attr
}

// passing marks a context whose record a deflog handler is passing on to
// the default handler: a deflog handler that sees it was reached again
// through the default — the program's default handler wraps a deflog
// handler, or is one — and drops the record rather than loop.
type passing struct{}

// target returns slog.Default()'s handler with h's attributes and groups,
// and the ctx to pass it; nil when ctx shows that the record comes back
// from the default handler (see passing).
func (h handler) target(ctx context.Context) (slog.Handler, context.Context) {
	if ctx == nil {
		ctx = context.Background()
	}
	if ctx.Value(passing{}) != nil {
		return nil, ctx
	}
	d := slog.Default().Handler()
	if _, ok := d.(handler); ok {
		return nil, ctx
	}
	for _, o := range h.ops {
		if o.group != "" {
			d = d.WithGroup(o.group)
		} else {
			d = d.WithAttrs(o.attrs)
		}
	}
	return d, context.WithValue(ctx, passing{}, true)
}

// Enabled reports whether level is at least Level and the default
// handler takes it.
func (h handler) Enabled(ctx context.Context, level slog.Level) bool {
	if level < Level {
		return false
	}
	d, ctx := h.target(ctx)
	return d != nil && d.Enabled(ctx, level)
}

// Handle passes r to the default handler.
func (h handler) Handle(ctx context.Context, r slog.Record) error {
	if r.Level < Level {
		return nil
	}
	d, ctx := h.target(ctx)
	if d == nil {
		return nil
	}
	return d.Handle(ctx, r)
}

// WithAttrs returns a handler that adds attrs to every record.
func (h handler) WithAttrs(attrs []slog.Attr) slog.Handler {
	if len(attrs) == 0 {
		return h
	}
	return handler{ops: append(h.ops[:len(h.ops):len(h.ops)], op{attrs: attrs})}
}

// WithGroup returns a handler that puts later attributes in group name.
func (h handler) WithGroup(name string) slog.Handler {
	if name == "" {
		return h
	}
	return handler{ops: append(h.ops[:len(h.ops):len(h.ops)], op{group: name})}
}
