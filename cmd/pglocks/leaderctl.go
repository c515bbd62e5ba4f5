package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"time"

	"github.com/pglocks/pglocks/leader"
	"github.com/pglocks/pglocks/lease"
)

// cmdLeader asks the leader of an election, in whatever process it runs,
// to resign or to hand its term over, and prints the next leader.
func cmdLeader(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	const use = "usage: pglocks leader resign [--wait D] NAME | pglocks leader handover [--to ID] [--wait D] NAME"
	if len(args) == 0 || (args[0] != "resign" && args[0] != "handover") {
		if len(args) > 0 && (args[0] == "--help" || args[0] == "-h") {
			fmt.Fprint(stdout, helps["leader"], exitTable)
			return flag.ErrHelp
		}
		return fail(exitUsage, use)
	}
	verb := args[0]
	fs, dsn := newFlags(ctx, "leader "+verb, helps["leader"], stdout, stderr, true)
	to := fs.String("to", "", "handover: the candidate's identity (default: any other live candidate)")
	wait := &waitFlag{d: 30 * time.Second}
	fs.Var(wait, "wait", "how long to wait for the next term")
	var t tables
	t.add(fs)
	if err := parse(fs, args[1:]); err != nil {
		return err
	}
	if fs.NArg() != 1 || (verb == "resign" && *to != "") {
		return fail(exitUsage, use)
	}
	if err := t.check(); err != nil {
		return err
	}
	wctx, cancel := context.WithTimeout(ctx, wait.d)
	defer cancel()
	return withStore(ctx, *dsn, t, func(store *lease.Store) error {
		var (
			l   leader.Leader
			err error
		)
		if verb == "resign" {
			l, err = leader.RequestResign(wctx, store, fs.Arg(0))
		} else {
			l, err = leader.RequestHandOver(wctx, store, fs.Arg(0), *to)
		}
		switch {
		case errors.Is(err, leader.ErrNoLeader), errors.Is(err, leader.ErrNoCandidate):
			return fail(exitNotFound, "%v", err)
		case err != nil:
			return err
		}
		fmt.Fprintf(stdout, "election %s: term %d led by %s\n", fs.Arg(0), l.Term, l.Identity)
		return nil
	})
}
