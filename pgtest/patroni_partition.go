package pgtest

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// Partition cuts name off the network for real, as a host that drops
// off it: its Patroni and its PostgreSQL lose etcd, HAProxy, every client
// and the other nodes (its standbys' replication, their Patroni's REST
// calls) at once. Every packet to or from the node is dropped silently,
// both ways, beyond every endpoint's interface — no reset, no ICMP —
// until [Patroni.Heal] (or [Failover.Recover]). Processes on the node
// keep running; its Unix socket is not cut. It needs the nodes in
// namespaces (Linux, root, ip and nft: see [Patroni]); otherwise the
// error wraps [ErrUnsupported].
//
// What the others see, with Debian's Patroni 3.0.2: the node's Patroni
// can no longer reach etcd, and after its retries (retry_timeout, 5 s)
// demotes its PostgreSQL — a fast shutdown that ends every session, then
// a restart read-only; the leader key it no longer renews expires after
// the TTL and a synchronous standby is promoted. A client's connection
// to the node hears nothing: a statement in flight fails when the
// client's tcp_user_timeout or keepalives give up (ETIMEDOUT), a new
// connection hangs until its connect_timeout. The multi-host DSN's
// clients move to the new primary once they give up on the old one;
// HAProxy marks the node down when its REST API stops answering.
func (p *Patroni) Partition(name string) error { return p.setCut("Partition", name, true) }

// Heal reconnects a node cut off by [Patroni.Partition]: its Patroni
// reaches etcd again and, if another node leads by then, rejoins as a
// replica, rewinding its PostgreSQL (pg_rewind) if it diverged. Healing
// a node that is not cut off does nothing.
func (p *Patroni) Heal(name string) error { return p.setCut("Heal", name, false) }

func (p *Patroni) setCut(op, name string, cut bool) error {
	if p.net == nil {
		return fmt.Errorf("pgtest: %s: the Patroni nodes are on loopback, which cannot be cut (%v): %w", op, p.netErr, ErrUnsupported)
	}
	for i, n := range p.nodes {
		if n.name == name {
			if err := p.net.setCut(i, cut); err != nil {
				return fmt.Errorf("pgtest: %s %s: %w", op, name, err)
			}
			return nil
		}
	}
	return fmt.Errorf("pgtest: %s: no Patroni node %q", op, name)
}

// watchDemotion polls name's PostgreSQL through its Unix socket, which no
// partition cuts, and sends when it first found it no primary (see
// primaryLocally), once; nothing if ctx ends first.
func (p *Patroni) watchDemotion(ctx context.Context, name string) <-chan time.Time {
	out := make(chan time.Time, 1)
	go func() {
		for {
			if primary, known := p.primaryLocally(ctx, name); known && !primary {
				out <- time.Now()
				return
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(50 * time.Millisecond):
			}
		}
	}()
	return out
}

// primaryLocally asks name's PostgreSQL, through its Unix socket, whether
// it is a primary: yes if it answers that it is out of recovery; no if it
// is in recovery, refuses the connection (shutting down, starting up) or
// does not run. known is false when it could not tell (a timeout: a
// server too busy or stopped to answer).
func (p *Patroni) primaryLocally(ctx context.Context, name string) (primary, known bool) {
	n, err := p.node(name)
	if err != nil {
		return false, false
	}
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	dsn := "host=" + n.dir + " port=" + strconv.Itoa(n.pgPort) + " user=postgres dbname=postgres sslmode=disable connect_timeout=2"
	conn, err := pgx.Connect(ctx, dsn)
	if err != nil {
		return false, !pgconn.Timeout(err) && ctx.Err() == nil
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var recovery bool
	if err := conn.QueryRow(ctx, "select pg_catalog.pg_is_in_recovery()").Scan(&recovery); err != nil {
		return false, false
	}
	return !recovery, true
}

// leaderKey returns the node Patroni's leader key in etcd names, "" if the
// key does not exist (it expired, or was released).
func (p *Patroni) leaderKey(ctx context.Context) (string, error) {
	b, err := p.etcdKey(ctx, "leader")
	return string(b), err
}

// etcdKey reads the value of Patroni's key /service/pgtest/<name>; nil if
// it does not exist.
func (p *Patroni) etcdKey(ctx context.Context, name string) ([]byte, error) {
	kv, err := p.etcdGet(ctx, name)
	if err != nil || kv == nil {
		return nil, err
	}
	return kv.Value, nil
}

// etcdKV is a key as etcd's JSON gateway returns it.
type etcdKV struct {
	Value []byte // base64 in JSON: []byte decodes it
	Lease int64  `json:"lease,string"` // 0: the key has no lease
}

// etcdGet reads Patroni's key /service/pgtest/<name> through etcd's JSON
// gateway; nil if it does not exist.
func (p *Patroni) etcdGet(ctx context.Context, name string) (*etcdKV, error) {
	var r struct{ Kvs []etcdKV }
	body := fmt.Sprintf(`{"key": %q}`, base64.StdEncoding.EncodeToString([]byte("/service/pgtest/"+name)))
	if err := p.etcdPost(ctx, "/v3/kv/range", body, &r); err != nil {
		return nil, fmt.Errorf("pgtest: etcd's answer for the %s key: %w", name, err)
	}
	if len(r.Kvs) == 0 {
		return nil, nil
	}
	return &r.Kvs[0], nil
}

// etcdPost posts body to path of etcd's JSON gateway, within 2 s, and
// decodes its answer into out.
func (p *Patroni) etcdPost(ctx context.Context, path, body string, out any) error {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+p.host+":"+strconv.Itoa(p.etcd)+path, strings.NewReader(body))
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	return json.NewDecoder(resp.Body).Decode(out)
}

// Supports reports whether f can be played on this cluster: every fault
// can but [FaultPartition], which needs the nodes in network namespaces of
// their own (root on Linux, with ip and nft); elsewhere they run on
// loopback, and Partition returns [ErrUnsupported].
func (p *Patroni) Supports(f PatroniFault) bool {
	return f != FaultPartition || p.net != nil
}
