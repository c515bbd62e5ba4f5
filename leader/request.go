package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// A request to the leader of an election is a lease row named
// "pglocks.leader:" + election + "#req:" + term, taken by the requester
// with what it asks in its metadata; the requester then breaks the
// leader's candidate row, which its Store hears of at once (NOTIFY, or its
// keep-alive's next check), and the leader reads the request of its term.
// A request names the term it is for, so a later leader never acts on it.

const (
	actionResign   = "resign"
	actionHandOver = "handover"
	// requestTTL is how long a request row is held: a second request for
	// the same term within it is refused.
	requestTTL = 10 * time.Second
)

type request struct {
	Action string `json:"action"`
	To     string `json:"to,omitempty"`
	From   string `json:"from"`
}

func requestName(election string, term int64) string {
	return leaseName(election) + requestMark + strconv.FormatInt(term, 10)
}

// RequestResign asks the current leader of election, in whatever process
// it runs, to resign (as [Elector.Resign]), and waits until a later term
// is held — by any candidate, the resigned one too once it has sat out
// RetryInterval — and returns its leader. ctx bounds the whole; if it
// ends first the request may still take effect. It needs no Elector, only
// a Store on the election's lease table. An election with no leader gives
// [ErrNoLeader]; a leader whose candidate row is not there (it runs a
// version without candidates, or shares its Identity) cannot be asked,
// and that is an error too.
func RequestResign(ctx context.Context, store *lease.Store, election string) (Leader, error) {
	return ask(ctx, store, election, request{Action: actionResign})
}

// RequestHandOver asks the current leader of election to hand its term
// over to the live candidate to, or to any other live candidate if to is
// "" (see [Elector.HandOver]), and waits until a later term is held and
// returns its leader. A target that is not a live candidate, or is the
// leader itself, gives [ErrNoCandidate] without asking. Otherwise as
// [RequestResign].
func RequestHandOver(ctx context.Context, store *lease.Store, election, to string) (Leader, error) {
	return ask(ctx, store, election, request{Action: actionHandOver, To: to})
}

func ask(ctx context.Context, store *lease.Store, election string, r request) (Leader, error) {
	if err := checkRequestArgs(ctx, store, election); err != nil {
		return Leader{}, fmt.Errorf("leader: request %s: %w", r.Action, err)
	}
	fail := func(err error) (Leader, error) {
		return Leader{}, fmt.Errorf("leader: request %s in %q: %w", r.Action, election, err)
	}
	cs, err := Candidates(ctx, store, election)
	if err != nil {
		return fail(err)
	}
	info, err := store.Get(ctx, leaseName(election))
	if errors.Is(err, lease.ErrNotFound) || err == nil && !info.Held {
		return fail(ErrNoLeader)
	}
	if err != nil {
		return fail(err)
	}
	cur := leaderFromInfo(election, info)
	if r.Action == actionHandOver {
		if _, err := chooseTarget(cs, cur.Identity, r.To); err != nil {
			return fail(err)
		}
	}
	host, _ := os.Hostname()
	r.From = host + " pid " + strconv.Itoa(os.Getpid())
	if err := deliver(ctx, store, election, cur, r); err != nil {
		return fail(err)
	}
	return awaitTerm(ctx, store, election, cur.Term)
}

// deliver takes the request's row and breaks the leader's candidate row.
func deliver(ctx context.Context, store *lease.Store, election string, cur Leader, r request) error {
	cand, err := store.Get(ctx, candidateName(election, cur.Identity))
	if err != nil || !cand.Held {
		return fmt.Errorf("the leader %q has no candidate row (a version without candidates, or two electors share its Identity): it cannot be asked (%v)", cur.Identity, err)
	}
	if m, ok := candidateOf(cand); !ok || m.Election != election || m.Identity != cur.Identity {
		return fmt.Errorf("the row %q is not its candidate row (another election's lease, made by a version that allowed such names?): it is not broken", cand.Name)
	}
	md, _ := json.Marshal(r)
	req, err := store.TryAcquire(ctx, requestName(election, cur.Term), requestTTL, lease.WithMetadata(md))
	if err != nil {
		return fmt.Errorf("write the request for term %d: %w", cur.Term, err)
	}
	// The row stays held until its TTL: the leader reads it, and a second
	// request for this term is refused meanwhile. The Lease is not renewed.
	_ = req
	if _, err := store.BreakAcquisition(ctx, cand.Name, cand.Owner, cand.Token); err != nil {
		return fmt.Errorf("wake the leader: %w", err)
	}
	return nil
}

// readRequest returns the request held for term, if any.
func readRequest(ctx context.Context, store *lease.Store, election string, term int64) (request, bool) {
	info, err := store.Get(ctx, requestName(election, term))
	if err != nil || !info.Held {
		return request{}, false
	}
	var r request
	if json.Unmarshal(info.Metadata, &r) != nil || (r.Action != actionResign && r.Action != actionHandOver) {
		return request{}, false
	}
	return r, true
}

// awaitTerm polls the election until a term later than term is held.
func awaitTerm(ctx context.Context, store *lease.Store, election string, term int64) (Leader, error) {
	for {
		info, err := store.Get(ctx, leaseName(election))
		if err == nil && info.Held && info.Token > term {
			return leaderFromInfo(election, info), nil
		}
		if !sleep(ctx, 10*time.Millisecond+time.Duration(time.Now().UnixNano()%10)*time.Millisecond) {
			return Leader{}, fmt.Errorf("leader: request in %q: delivered; no later term than %d held yet: %w", election, term, context.Cause(ctx))
		}
	}
}
