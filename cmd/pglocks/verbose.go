package main

import (
	"context"
	"io"
	"log/slog"
)

type loggerKey struct{}

// verbosity strips a leading -v (or --verbose) from args and returns a ctx
// carrying the logger the commands give the library: Debug and up to
// stderr with -v, else discard.
func verbosity(ctx context.Context, args []string, stderr io.Writer) (context.Context, []string) {
	if len(args) == 0 || (args[0] != "-v" && args[0] != "--verbose") {
		return ctx, args
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: slog.LevelDebug}))
	return context.WithValue(ctx, loggerKey{}, log), args[1:]
}

// loggerOf returns the logger verbosity put in ctx, or nil (the library's
// default: discard).
func loggerOf(ctx context.Context) *slog.Logger {
	log, _ := ctx.Value(loggerKey{}).(*slog.Logger)
	return log
}
