package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/lease"
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
}

type status struct {
	Advisory []advisoryLock `json:"advisory"`
	Leases   []leaseRow     `json:"leases"`
	Leaders  []leaderRow    `json:"leaders"`
}

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
	if err := parse(fs, args); err != nil {
		return err
	}
	if fs.NArg() > 1 {
		return fail(exitUsage, "usage: pglocks status [--json] [NAME]")
	}
	name := fs.Arg(0)
	pool, err := connect(ctx, *dsn)
	if err != nil {
		return err
	}
	defer pool.Close()
	st, err := readStatus(ctx, pool, name)
	if err != nil {
		return err
	}
	if *asJSON {
		enc := json.NewEncoder(stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	printStatus(stdout, st)
	return nil
}

func readStatus(ctx context.Context, pool *pgxpool.Pool, name string) (status, error) {
	st := status{Advisory: []advisoryLock{}, Leases: []leaseRow{}, Leaders: []leaderRow{}}
	// Names we know, to label keys: the asked-for name, and every lease
	// and election (a leader's campaign lock is KeyOf of its lease name).
	names := map[int64]string{}
	if name != "" {
		names[pglocks.KeyOf(name).Int64()] = name
	}
	store, err := lease.New(pool, lease.Config{Logger: loggerOf(ctx)})
	if err != nil {
		return st, err
	}
	defer store.Close(context.WithoutCancel(ctx))
	infos, err := store.List(ctx)
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) && pgErr.Code == "42P01" { // no lease table: no leases
		infos, err = nil, nil
	}
	if err != nil {
		return st, err
	}
	for _, in := range infos {
		names[pglocks.KeyOf(in.Name).Int64()] = in.Name
		if name != "" && in.Name != name && in.Name != leaderPrefix+name {
			continue
		}
		if election, ok := strings.CutPrefix(in.Name, leaderPrefix); ok {
			var md struct{ Identity string }
			_ = json.Unmarshal(in.Metadata, &md)
			st.Leaders = append(st.Leaders, leaderRow{Election: election, Held: in.Held, Identity: md.Identity,
				Term: in.Token, ExpiresIn: in.TimeLeft})
			continue
		}
		row := leaseRow{Name: in.Name, Held: in.Held, Token: in.Token, ExpiresIn: in.TimeLeft, Host: in.Hostname, PID: in.PID}
		if in.Held {
			row.Owner = in.Owner.String()
		}
		st.Leases = append(st.Leases, row)
	}
	locks, err := readAdvisory(ctx, pool, names)
	if err != nil {
		return st, err
	}
	for _, a := range locks {
		if name == "" || a.Name == name || a.Name == leaderPrefix+name {
			st.Advisory = append(st.Advisory, a)
		}
	}
	return st, nil
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

func printStatus(w io.Writer, st status) {
	tw := tabwriter.NewWriter(w, 2, 4, 2, ' ', 0)
	defer tw.Flush()
	fmt.Fprintln(tw, "ADVISORY LOCKS\t")
	if len(st.Advisory) == 0 {
		fmt.Fprintln(tw, "  (none)\t")
	} else {
		fmt.Fprintln(tw, "  KEY\tNAME\tPID\tAPPLICATION\tCLIENT\tMODE\tSTATE\tSINCE")
		for _, a := range st.Advisory {
			state := "held"
			if !a.Granted {
				state = "waiting"
			}
			fmt.Fprintf(tw, "  %s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\n", a.Key, a.Name, a.PID, a.Application, a.Client,
				strings.TrimSuffix(a.Mode, "Lock"), state, a.Since.Format(time.RFC3339))
		}
	}
	fmt.Fprintln(tw, "LEASES\t")
	if len(st.Leases) == 0 {
		fmt.Fprintln(tw, "  (none)\t")
	} else {
		fmt.Fprintln(tw, "  NAME\tSTATE\tOWNER\tTOKEN\tEXPIRES IN\tHOST\tPID")
		for _, l := range st.Leases {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\t%s\t%d\n", l.Name, heldWord(l.Held), l.Owner, l.Token,
				l.ExpiresIn.Round(time.Millisecond), l.Host, l.PID)
		}
	}
	fmt.Fprintln(tw, "LEADERS\t")
	if len(st.Leaders) == 0 {
		fmt.Fprintln(tw, "  (none)\t")
	} else {
		fmt.Fprintln(tw, "  ELECTION\tSTATE\tLEADER\tTERM\tEXPIRES IN")
		for _, l := range st.Leaders {
			fmt.Fprintf(tw, "  %s\t%s\t%s\t%d\t%s\n", l.Election, heldWord(l.Held), l.Identity, l.Term, l.ExpiresIn.Round(time.Millisecond))
		}
	}
}

func heldWord(held bool) string {
	if held {
		return "held"
	}
	return "free"
}
