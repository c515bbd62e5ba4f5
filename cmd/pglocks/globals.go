package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
	"strings"
)

type dsnKey struct{}

// globalOptions strips the options that come before the command (-v,
// --dsn URL, --version, --help) from args. It returns ctx with what they
// set, the rest of args, and done with a status when pglocks is to exit
// at once (--version, --help, a bad option).
func globalOptions(ctx context.Context, args []string, stdout, stderr io.Writer) (context.Context, []string, int, bool) {
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		opt, val, hasVal := strings.Cut(strings.TrimPrefix(args[0], "-"), "=")
		switch strings.TrimPrefix(opt, "-") {
		case "v", "verbose":
			ctx = withVerbose(ctx, stderr)
		case "dsn":
			if !hasVal {
				if len(args) < 2 {
					fmt.Fprintln(stderr, "pglocks: --dsn needs a connection string (see pglocks --help)")
					return ctx, nil, exitUsage, true
				}
				val, args = args[1], args[1:]
			}
			ctx = context.WithValue(ctx, dsnKey{}, val)
		case "version":
			fmt.Fprintln(stdout, "pglocks", version())
			return ctx, nil, 0, true
		case "h", "help":
			fmt.Fprint(stdout, usage, exitTable)
			return ctx, nil, 0, true
		default:
			fmt.Fprintf(stderr, "pglocks: unknown option %s (see pglocks --help)\n", args[0])
			return ctx, nil, exitUsage, true
		}
		args = args[1:]
	}
	return ctx, args, 0, false
}

// globalDSN returns the --dsn given before the command, or "".
func globalDSN(ctx context.Context) string {
	dsn, _ := ctx.Value(dsnKey{}).(string)
	return dsn
}

// version is the module's version pglocks was built from (go install
// …@v1.2.3), or "(devel)" when built from a checkout.
func version() string {
	bi, ok := debug.ReadBuildInfo()
	if !ok || bi.Main.Version == "" {
		return "(devel)"
	}
	return bi.Main.Version
}
