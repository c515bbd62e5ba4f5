package pgtest

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
)

// primaryState is what a primary says of itself and of its standbys.
type primaryState struct {
	timeline int64
	flushLSN string            // pg_current_wal_flush_lsn()
	standby  map[string]string // streaming walsenders: application_name → sync_state
}

// readPrimary reads name's timeline, flushed WAL position and streaming
// standbys (Patroni names each walreceiver after its node).
func (p *Patroni) readPrimary(ctx context.Context, name string) (primaryState, error) {
	st := primaryState{standby: map[string]string{}}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := p.connectNode(ctx, name)
	if err != nil {
		return st, err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	err = conn.QueryRow(ctx, `select ('x' || substr(pg_catalog.pg_walfile_name(l), 1, 8))::bit(32)::int8, l::text
		from (select pg_catalog.pg_current_wal_flush_lsn() as l) as w`).Scan(&st.timeline, &st.flushLSN)
	if err != nil {
		return st, err
	}
	rows, err := conn.Query(ctx, "select application_name, sync_state from pg_catalog.pg_stat_replication where state = 'streaming'")
	if err != nil {
		return st, err
	}
	defer rows.Close()
	for rows.Next() {
		var app, state string
		if err := rows.Scan(&app, &state); err != nil {
			return st, err
		}
		st.standby[app] = state
	}
	return st, rows.Err()
}

// caughtUp reports whether name is a replica whose own walreceiver
// streams on the primary's timeline and has received the primary's WAL up
// to st.flushLSN: a replica that still needs pg_rewind (left on an older
// timeline, or ahead of the fork) or is being rewound is not.
func (p *Patroni) caughtUp(ctx context.Context, name string, st primaryState) bool {
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	conn, err := p.connectNode(ctx, name)
	if err != nil {
		return false
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var ok bool
	err = conn.QueryRow(ctx, `select pg_catalog.pg_is_in_recovery()
		and coalesce((select status = 'streaming' and received_tli = $1 from pg_catalog.pg_stat_wal_receiver), false)
		and coalesce(pg_catalog.pg_last_wal_receive_lsn() >= $2::pg_lsn, false)`, st.timeline, st.flushLSN).Scan(&ok)
	return err == nil && ok
}

// syncStandbys returns the leader and synchronous standbys that Patroni's
// sync key in etcd names: the truth Patroni decides by, where a node's
// REST API (GET /sync) answers from its cached copy of it.
func (p *Patroni) syncStandbys(ctx context.Context) (leader string, standbys []string, err error) {
	b, err := p.etcdKey(ctx, "sync")
	if err != nil || b == nil {
		return "", nil, err
	}
	var k struct {
		Leader      string `json:"leader"`
		SyncStandby string `json:"sync_standby"`
	}
	if err := json.Unmarshal(b, &k); err != nil {
		return "", nil, fmt.Errorf("pgtest: Patroni's sync key %q: %w", b, err)
	}
	for _, s := range strings.Split(k.SyncStandby, ",") {
		if s = strings.TrimSpace(s); s != "" {
			standbys = append(standbys, s)
		}
	}
	return k.Leader, standbys, nil
}

// settled reports whether every node but primary is a replica streaming
// from it and caught up with it (see caughtUp, listed in its
// pg_stat_replication too) and, in synchronous mode, whether the sync key
// in etcd names primary its leader and a standby that the primary's
// pg_stat_replication shows streaming with sync_state 'sync'.
func (p *Patroni) settled(ctx context.Context, primary string) bool {
	st, err := p.readPrimary(ctx, primary)
	if err != nil {
		return false
	}
	for _, n := range p.nodes {
		if n.name == primary {
			continue
		}
		if _, ok := st.standby[n.name]; !ok || !p.caughtUp(ctx, n.name, st) {
			return false
		}
	}
	if p.opts.Async {
		return true
	}
	leader, standbys, err := p.syncStandbys(ctx)
	return err == nil && leader == primary && slices.ContainsFunc(standbys, func(s string) bool { return st.standby[s] == "sync" })
}

// connectNode connects to name alone.
func (p *Patroni) connectNode(ctx context.Context, name string) (*pgx.Conn, error) {
	dsn, err := p.NodeDSN(name)
	if err != nil {
		return nil, err
	}
	return pgx.Connect(ctx, dsn)
}
