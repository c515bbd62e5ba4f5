package main

import (
	"context"
	"io"
	"log/slog"
)

type loggerKey struct{}

// withVerbose returns a ctx carrying the logger the commands give the
// library with -v: Debug and up, to stderr.
func withVerbose(ctx context.Context, stderr io.Writer) context.Context {
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return context.WithValue(ctx, loggerKey{}, log)
}

// loggerOf returns the logger withVerbose put in ctx, or without -v one
// that discards everything. Never nil: the library logs Warn and up to
// slog.Default() when given none, which would print its own WARN lines
// beside pglocks' one-line errors (and mail them from cron).
func loggerOf(ctx context.Context) *slog.Logger {
	if log, _ := ctx.Value(loggerKey{}).(*slog.Logger); log != nil {
		return log
	}
	return slog.New(slog.DiscardHandler)
}

// verbose reports whether -v was given.
func verbose(ctx context.Context) bool {
	log, _ := ctx.Value(loggerKey{}).(*slog.Logger)
	return log != nil
}
