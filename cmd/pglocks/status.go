package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/lease"
	"github.com/pglocks/pglocks/schedule"
)

// advisoryLock is one session holding or waiting for an advisory lock.
type advisoryLock struct {
	Key         string    `json:"key"`
	Name        string    `json:"name,omitempty"`
	PID         uint32    `json:"pid"`
	Application string    `json:"application_name"`
	Client      string    `json:"client"`
	Mode        string    `json:"mode"`
	Granted     bool      `json:"granted"`
	Since       time.Time `json:"since,omitzero"`
}

type leaseRow struct {
	Name      string        `json:"name"`
	Held      bool          `json:"held"`
	Owner     string        `json:"owner,omitempty"`
	Token     int64         `json:"token"`
	ExpiresIn time.Duration `json:"expires_in_ns"`
	Host      string        `json:"hostname,omitempty"`
	PID       int           `json:"pid,omitempty"`
}

type leaderRow struct {
	Election  string        `json:"election"`
	Held      bool          `json:"held"`
	Identity  string        `json:"identity,omitempty"`
	Term      int64         `json:"term"`
	ExpiresIn time.Duration `json:"expires_in_ns"`
	Value     string        `json:"value,omitempty"`
}

// candidateRow is one running candidate of an election (package leader).
type candidateRow struct {
	Election string    `json:"election"`
	Identity string    `json:"identity"`
	Value    string    `json:"value,omitempty"`
	JoinedAt time.Time `json:"joined_at"`
	LastSeen time.Time `json:"last_seen"`
	Host     string    `json:"hostname,omitempty"`
	PID      int       `json:"pid,omitempty"`
}

// runRow is one run of a scheduled job (pglocks run --once-per).
type runRow struct {
	Job     string    `json:"job"`
	Slot    string    `json:"slot"`
	Outcome string    `json:"outcome"`
	Token   int64     `json:"token"`
	Host    string    `json:"hostname,omitempty"`
	PID     int       `json:"pid,omitempty"`
	Start   time.Time `json:"start"`
	End     time.Time `json:"end,omitzero"`
	Error   string    `json:"error,omitempty"`
}

type status struct {
	Advisory []advisoryLock `json:"advisory"`
	// Semaphore is the advisory semaphore NAME (pglocks run --max), when
	// status was given NAME and a permit of it is held.
	Semaphore *semaphoreRow `json:"semaphore,omitempty"`
	Leases    []leaseRow    `json:"leases"`
	Leaders   []leaderRow   `json:"leaders"`
	// Candidates are the running candidates of the elections listed.
	Candidates []candidateRow `json:"candidates"`
	// Shards are the groups of package shard (of group NAME if given).
	Shards []shardGroup `json:"shards"`
	Runs   []runRow     `json:"runs"`
	// Missing names the tables not found, with the command that creates
	// them.
	Missing []string `json:"missing,omitempty"`
}

// recentRuns is how many runs of scheduled jobs status shows.
const recentRuns = 20

// leaderPrefix is the lease-name prefix of leader elections.
const leaderPrefix = "pglocks.leader:"

// allAdvisorySQL lists the advisory locks of the current database. A bigint
// key is classid<<32 | objid (objsubid 1); a pair is (classid, objid).
const allAdvisorySQL = `select l.classid::int8, l.objid::int8, l.objsubid, coalesce(l.pid, 0),
	coalesce(a.application_name, ''), coalesce(host(a.client_addr), 'local'), l.mode, l.granted,
	case when l.granted then a.backend_start else (to_jsonb(l)->>'waitstart')::timestamptz end
from pg_locks l left join pg_stat_activity a on a.pid = l.pid
where l.locktype = 'advisory' and l.database = (select oid from pg_database where datname = current_database())
order by 1, 2, 3, l.granted desc, l.pid`

func cmdStatus(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	fs, dsn := newFlags(ctx, "status", helps["status"], stdout, stderr, true)
	asJSON := fs.Bool("json", false, "print JSON")
	shards := fs.Bool("shards", false, "list every shard of each group, with its owner (--json always does)")
	var t tables
	t.add(fs)
	if err := parse(fs, args); err != nil {
		return err
	}
	if err := t.check(); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return fail(exitUsage, "usage: pglocks status [--json] [--shards] [NAME]")
	}
	name := fs.Arg(0)
	pool, err := connect(ctx, *dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := readStatus(ctx, pool, name, t)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printStatus(stdout, st, *shards || name != "")
	return nil
}

func readStatus(ctx context.Context, pool *pgxpool.Pool, name string, t tables) (status, error) {
	st := status{Advisory: []advisoryLock{}, Leases: []leaseRow{}, Leaders: []leaderRow{}, Candidates: []candidateRow{},
		Shards: []shardGroup{}, Runs: []runRow{}}
	// Names we know, to label keys: the asked-for name, and every lease
	// and election (a leader's campaign lock is KeyOf of its lease name).
	names := map[int64]string{}
	if name != "" {
		names[pglocks.KeyOf(name).Int64()] = name
		labelSemaphore(names, name)
	}
	store, runner, err := t.runner(ctx, pool, 30*time.Second)
	if err != nil {
		return st, err
	}
	defer store.Close(context.WithoutCancel(ctx))
	// The groups' rows first, then the held ones: a shard taken in between
	// is listed held, not free.
	groups, err := readShardRows(ctx, pool, t)
	if err != nil && !noTable(err) {
		return st, err
	}
	infos, err := store.List(ctx)
	if noTable(err) {
		st.Missing = append(st.Missing, fmt.Sprintf("no lease table %s.%s (run pglocks migrate)", t.schema, t.table))
		infos, err = nil, nil
	}
	if err != nil {
		return st, err
	}
	if err := st.readRuns(ctx, runner, name, t); err != nil {
		return st, err
	}
	for _, in := range infos {
		names[pglocks.KeyOf(in.Name).Int64()] = in.Name
	}
	st.addLeases(groups.addShards(infos, name), name)
	st.Shards = groups.list(name)
	locks, err := readAdvisory(ctx, pool, names)
	if err != nil {
		return st, err
	}
	for _, a := range locks {
		if name == "" || a.Name == name || a.Name == leaderPrefix+name || strings.HasPrefix(a.Name, name+semLabel) {
			st.Advisory = append(st.Advisory, a)
		}
	}
	if name != "" {
		st.Semaphore, err = readSemaphore(ctx, pool, name)
	}
	return st, err
}

// addLeases adds infos to the leases, leaders and candidates (only those
// of name if set).
func (st *status) addLeases(infos []lease.Info, name string) {
	for _, in := range infos {
		if st.addElection(in, name) {
			continue
		}
		if name != "" && in.Name != name {
			continue
		}
		row := leaseRow{Name: in.Name, Held: in.Held, Token: in.Token, ExpiresIn: in.TimeLeft, Host: in.Hostname, PID: in.PID}
		if in.Held {
			row.Owner = in.Owner.String()
		}
		st.Leases = append(st.Leases, row)
	}
}

// addElection adds in to the leaders or candidates if it is an
// election's row, or one of its own (a request), and reports whether it
// was; only those of election name if set.
func (st *status) addElection(in lease.Info, name string) bool {
	rest, ok := strings.CutPrefix(in.Name, leaderPrefix)
	if !ok {
		return false
	}
	var md struct {
		Candidate, Identity, Value string
	}
	_ = json.Unmarshal(in.Metadata, &md)
	switch election, _, sub := strings.Cut(rest, "#"); {
	case md.Candidate != "" && rest == md.Candidate+"#c:"+md.Identity:
		if name == "" || md.Candidate == name || in.Name == name {
			st.Candidates = append(st.Candidates, candidateRow{Election: md.Candidate, Identity: md.Identity,
				Value: md.Value, JoinedAt: in.AcquiredAt, LastSeen: in.RenewedAt, Host: in.Hostname, PID: in.PID})
		}
	case sub && strings.HasPrefix(rest[len(election):], "#req:"):
		// a request to a leader (pglocks leader resign|handover)
	case name == "" || rest == name || in.Name == name:
		st.Leaders = append(st.Leaders, leaderRow{Election: rest, Held: in.Held, Identity: md.Identity,
			Term: in.Token, ExpiresIn: in.TimeLeft, Value: md.Value})
	}
	return true
}

// readRuns reads the newest runs of scheduled jobs (of job name if set).
func (st *status) readRuns(ctx context.Context, runner *schedule.Runner, name string, t tables) error {
	recs, err := runner.History(ctx, name, recentRuns)
	if noTable(err) {
		st.Missing = append(st.Missing, fmt.Sprintf("no run table %s.%s (run pglocks migrate)", t.schema, t.runTable))
		return nil
	}
	if err != nil {
		return err
	}
	for _, r := range recs {
		st.Runs = append(st.Runs, runRow{Job: r.Job, Slot: r.Slot, Outcome: string(r.Outcome), Token: r.Token,
			Host: r.Hostname, PID: r.PID, Start: r.Start, End: r.End, Error: r.Error})
	}
	return nil
}

// noTable reports whether err says a table is missing.
func noTable(err error) bool {
	var pgErr *pgconn.PgError
	return errors.Is(err, lease.ErrNoTable) || errors.As(err, &pgErr) && pgErr.Code == "42P01"
}

// readAdvisory reads every advisory lock of the database, labelling keys
// with the names they were made from where names knows them.
func readAdvisory(ctx context.Context, pool *pgxpool.Pool, names map[int64]string) ([]advisoryLock, error) {
	rows, err := pool.Query(ctx, allAdvisorySQL)
	if err != nil {
		return nil, err
	}
	return pgx.CollectRows(rows, func(r pgx.CollectableRow) (advisoryLock, error) {
		var classid, objid int64
		var objsubid int16
		var pid int32
		var since *time.Time
		var a advisoryLock
		err := r.Scan(&classid, &objid, &objsubid, &pid, &a.Application, &a.Client, &a.Mode, &a.Granted, &since)
		a.PID = uint32(pid)
		if since != nil {
			a.Since = *since
		}
		if objsubid == 2 {
			a.Key = fmt.Sprintf("(%d,%d)", int32(classid), int32(objid))
		} else {
			k := int64(uint64(classid)<<32 | uint64(objid))
			a.Key, a.Name = fmt.Sprint(k), names[k]
		}
		return a, err
	})
}

// printStatus prints st as aligned sections; no line ends in spaces
// (tabwriter pads a cell that an empty last one follows).
func printStatus(w io.Writer, st status, allShards bool) {
	var buf bytes.Buffer
	tw := tabwriter.NewWriter(&buf, 2, 4, 2, ' ', 0)
	defer func() {
		_ = tw.Flush()
		for line := range strings.Lines(buf.String()) {
			fmt.Fprintln(w, strings.TrimRight(line, " \n"))
		}
	}()
	fmt.Fprintln(tw, "ADVISORY LOCKS")
	if len(st.Advisory) == 0 {
		fmt.Fprintln(tw, "  (none)")
	} else {
		fmt.Fprintln(tw, "  KEY\tNAME\tBACKEND PID\tAPPLICATION\tCLIENT\tMODE\tSTATE\tSINCE")
		for _, a := range st.Advisory {
			state := "held"
			if !a.Granted {
				state = "waiting"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", a.Key, a.Name, a.PID, a.Application, a.Client,
				strings.TrimSuffix(a.Mode, "Lock"), state, a.Since.Format(time.RFC3339))
		}
	}
	printSemaphore(tw, st.Semaphore)
	fmt.Fprintln(tw, "LEASES")
	if slices.ContainsFunc(st.Missing, func(m string) bool { return strings.HasPrefix(m, "no lease table") }) {
		fmt.Fprintln(tw, "  no lease table (run pglocks migrate)")
	} else if len(st.Leases) == 0 {
		fmt.Fprintln(tw, "  (none)")
	} else {
		fmt.Fprintln(tw, "  NAME\tSTATE\tOWNER\tTOKEN\tEXPIRES IN\tHOST\tHOLDER PID")
		for _, l := range st.Leases {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t%d\n", l.Name, heldWord(l.Held), l.Owner, l.Token,
				l.ExpiresIn.Round(time.Millisecond), l.Host, l.PID)
		}
	}
	fmt.Fprintln(tw, "LEADERS")
	if len(st.Leaders) == 0 {
		fmt.Fprintln(tw, "  (none)")
	} else {
		fmt.Fprintln(tw, "  ELECTION\tSTATE\tLEADER\tTERM\tEXPIRES IN")
		for _, l := range st.Leaders {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\n", l.Election, heldWord(l.Held), l.Identity, l.Term, l.ExpiresIn.Round(time.Millisecond))
		}
	}
	fmt.Fprintln(tw, "CANDIDATES")
	if len(st.Candidates) == 0 {
		fmt.Fprintln(tw, "  (none)")
	} else {
		fmt.Fprintln(tw, "  ELECTION\tIDENTITY\tVALUE\tJOINED\tLAST SEEN\tHOST\tPID")
		for _, c := range st.Candidates {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%s\t%s\t%s\t%d\n", c.Election, c.Identity, c.Value,
				c.JoinedAt.Format(time.RFC3339), c.LastSeen.Format(time.RFC3339Nano), c.Host, c.PID)
		}
	}
	printShards(tw, st.Shards, allShards)
	printRuns(tw, st)
}

// printRuns prints the scheduled jobs' recent runs.
func printRuns(tw io.Writer, st status) {
	fmt.Fprintln(tw, "SCHEDULED RUNS")
	switch {
	case slices.ContainsFunc(st.Missing, func(m string) bool { return strings.HasPrefix(m, "no run table") }):
		fmt.Fprintln(tw, "  no run table (run pglocks migrate)")
	case len(st.Runs) == 0:
		fmt.Fprintln(tw, "  (none)")
	default:
		fmt.Fprintln(tw, "  JOB\tSLOT\tOUTCOME\tTOKEN\tHOST\tHOLDER PID\tSTART\tEND")
		for _, r := range st.Runs {
			end := ""
			if !r.End.IsZero() {
				end = r.End.Format(time.RFC3339)
			}
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%d\t%s\t%s\n", r.Job, r.Slot, r.Outcome, r.Token, r.Host, r.PID,
				r.Start.Format(time.RFC3339), end)
		}
	}
}

func heldWord(held bool) string {
	if held {
		return "held"
	}
	return "free"
}
