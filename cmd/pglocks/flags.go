package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"
	"time"
)

const usage = `usage: pglocks [-v] [--dsn URL] COMMAND [FLAGS] ...
       pglocks --version | --help
  pglocks run [-n | -w SECONDS] [-E CODE] [-q] [--lease [--ttl D]] NAME -- CMD [ARGS...]
  pglocks run [-n | -w SECONDS] [-E CODE] [-q] (-s | --max N) NAME -- CMD [ARGS...]
  pglocks run --once-per PERIOD [-E CODE] [-q] NAME -- CMD [ARGS...]
  pglocks status [--json] [--shards] [NAME]
  pglocks key [--sql] NAME
  pglocks migrate [--schema S] [--table T] [--run-table T]
  pglocks break NAME
  pglocks leader resign [--wait D] NAME
  pglocks leader handover [--to ID] [--wait D] NAME
  pglocks doctor [--need FEATURES] [--schema S] [--table T] [--run-table T]
Flags come before NAME. -v logs the library's events to stderr. The
database is --dsn (before or after COMMAND), else DATABASE_URL, else
libpq's PG* variables.
"pglocks COMMAND --help" tells more.
`

// exitTable is printed by every --help.
const exitTable = `
EXIT STATUS
  0      success; run: CMD's own status, whatever it is
  1      doctor: a feature named in --need is not safe there
  64     usage error: a bad flag, name, --ttl or connection string
  66     break: no lease of that name; leader: no leader, or no such live
         candidate
  69     the database cannot be reached, or refused; with --wait, once the
         wait ran out (an outage is waited through up to its bound)
  70     run: pglocks' supervisor of the job was killed; CMD's status unknown
  75     run: the lock is held elsewhere, or --wait ran out (-E sets it)
  76     run: the lock was lost while the job ran; the job was stopped
  78     not set up: no lease or run table (run pglocks migrate), a missing
         privilege, a read-only server
  79     run --once-per: this slot was run, or is being run, elsewhere
         (-E sets it; nothing is printed unless -v)
  126    run: CMD is not executable (as shells; flock(1) says 69 or 71)
  127    run: CMD was not found (as shells)
  128+N  run: CMD was killed by signal N
`

// helps are the commands' --help texts before their flags.
var helps = map[string]string{
	"status": `usage: pglocks status [--json] [--shards] [NAME]

Lists the advisory locks of the database (KEY, NAME when known, the server
backend pid of the session that holds or waits: not a process of yours),
the leases (HOLDER PID: the process that holds it, on HOST), the leaders
and candidates of elections, the groups of package shard (per group its
live members and how many shards each holds, and the free shards; every
shard with its owner under --shards, or when NAME is the group), and the
scheduled jobs' recent runs (pglocks run --once-per, package schedule).
A missing table is named, with the command that creates it.
`,
	"key": `usage: pglocks key [--sql] NAME

Prints the advisory-lock key of NAME, for scripts:
  psql -c "select pg_catalog.pg_try_advisory_lock($(pglocks key nightly))"
`,
	"migrate": `usage: pglocks migrate [--schema S] [--table T] [--run-table T]

Creates the lease table and the scheduled jobs' run table (and the schema,
if not public) when missing: idempotent, safe from several hosts at once.
Leases (run --lease), leaders and run --once-per need them; plain run does
not. It needs CREATE on the schema.
`,
	"break": `usage: pglocks break NAME

Breaks the lease NAME: its token is bumped, so its holder loses it (a
pglocks run --lease holding it stops its job and exits 76) and the
holder's guarded writes fail.
`,
	"leader": `usage: pglocks leader resign [--wait D] NAME
       pglocks leader handover [--to ID] [--wait D] NAME

Asks the leader of election NAME, in whatever process it runs, to resign,
or to hand its term over to the live candidate ID (default: any other):
it stops its work, and the target takes the next term at once. Prints the
leader of the next term once it is held (within --wait, default 30s).
Candidates are listed by pglocks status.
`,
	"doctor": `usage: pglocks doctor [--need FEATURES] [--schema S] [--table T] [--run-table T]

Checks a database for pglocks: server, pooler and its mode, session locks,
NOTIFY, the lease and run tables and their privileges, settings, clock
offset; and which features are safe there. Exits 1 when a feature of
--need is not.
`,
}

// newFlags returns a flag set for a subcommand whose --help prints help
// (with the flags and the exit table) to stdout, and whose errors are one
// line on stderr. With db, it has --dsn, defaulting to the --dsn given
// before the command.
func newFlags(ctx context.Context, name, help string, stdout, stderr io.Writer, db bool) (*flag.FlagSet, *string) {
	fs := flag.NewFlagSet("pglocks "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprint(stdout, help, "\nFLAGS\n")
		fs.SetOutput(stdout)
		fs.PrintDefaults()
		fmt.Fprint(stdout, exitTable)
	}
	var dsn *string
	if db {
		dsn = fs.String("dsn", globalDSN(ctx), "PostgreSQL connection string (default: DATABASE_URL, else libpq PG* variables)")
	}
	return fs, dsn
}

// parse parses args; --help prints the help, a bad flag one line.
func parse(fs *flag.FlagSet, args []string) error {
	help, out := fs.Usage, fs.Output()
	var msg bytes.Buffer
	fs.Usage = func() {}
	fs.SetOutput(&msg)
	err := fs.Parse(args)
	fs.Usage = help
	fs.SetOutput(out)
	switch {
	case errors.Is(err, flag.ErrHelp):
		help()
		return err
	case err != nil:
		return fail(exitUsage, "%s: %s (see %s --help)", strings.TrimPrefix(fs.Name(), "pglocks "),
			strings.TrimSpace(msg.String()), fs.Name())
	}
	if i := len(args) - fs.NArg(); i > 0 && args[i-1] == "--" {
		return nil // "--" ended the flags: what follows is not one
	}
	return lateFlag(fs)
}

// lateFlag returns a usage error naming a flag of fs given after the
// first argument that is not a flag (NAME), before any "--": flags come
// before NAME, as in every command, and the flag package would otherwise
// take it for a second NAME.
func lateFlag(fs *flag.FlagSet) error {
	for _, a := range fs.Args() {
		if a == "--" {
			return nil
		}
		name, _, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		if strings.HasPrefix(a, "-") && name != "" && fs.Lookup(name) != nil {
			return fail(exitUsage, "%s: flag %s after NAME: flags come before NAME (see %s --help)",
				strings.TrimPrefix(fs.Name(), "pglocks "), a, fs.Name())
		}
	}
	return nil
}

// waitFlag is --wait: plain seconds ("30", "0.5"), as flock -w takes, or a
// Go duration ("30s", "2m").
type waitFlag struct{ d time.Duration }

func (w *waitFlag) String() string { return w.d.String() }

func (w *waitFlag) Set(s string) error {
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		if f < 0 || math.IsNaN(f) || f > math.MaxInt64/float64(time.Second) {
			return fmt.Errorf("must be 0 or more seconds")
		}
		w.d = time.Duration(f * float64(time.Second))
		return nil
	}
	d, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("want seconds (30) or a duration (30s, 2m)")
	}
	if d < 0 {
		return fmt.Errorf("must not be negative")
	}
	w.d = d
	return nil
}
