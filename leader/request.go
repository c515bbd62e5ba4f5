package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/pglocks/pglocks/internal/backoff"
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
	Election string `json:"election"`
	Action   string `json:"action"`
	To       string `json:"to,omitempty"`
	From     string `json:"from"`
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
	r.From, r.Election = host+" pid "+strconv.Itoa(os.Getpid()), election
	req, err := deliver(ctx, store, election, cur, r)
	if err != nil {
		return fail(err)
	}
	l, err := awaitTerm(ctx, store, election, cur.Term, req.token)
	if req.lease != nil && (err == nil || !errors.Is(err, context.Cause(ctx))) {
		// Answered: the request is done with. Left alone when ctx ended,
		// so that it may still take effect (it expires at requestTTL).
		forgetRequest(ctx, store, req.lease)
	}
	return l, err
}

// delivered is a request sent: its row's token, and its lease when this
// requester took it (nil when it joined an identical request under way).
type delivered struct {
	token int64
	lease *lease.Lease
}

// deliver takes the request's row and breaks the leader's candidate row.
// A request for the same term already under way is joined if it asks the
// same (a retried command), and refused with a clear error otherwise.
func deliver(ctx context.Context, store *lease.Store, election string, cur Leader, r request) (delivered, error) {
	cand, err := store.Get(ctx, candidateName(election, cur.Identity))
	if err != nil || !cand.Held {
		return delivered{}, fmt.Errorf("the leader %q has no candidate row (a version without candidates, or two electors share its Identity): it cannot be asked (%v)", cur.Identity, err)
	}
	if m, ok := candidateOf(cand); !ok || m.Election != election || m.Identity != cur.Identity {
		return delivered{}, fmt.Errorf("the row %q is not its candidate row (another election's lease, made by a version that allowed such names?): it is not broken", cand.Name)
	}
	md, _ := json.Marshal(r)
	name := requestName(election, cur.Term)
	req, err := store.TryAcquire(ctx, name, requestTTL, lease.WithMetadata(md))
	if errors.Is(err, lease.ErrHeld) {
		return pending(ctx, store, name, cur.Term, r)
	}
	if err != nil {
		return delivered{}, fmt.Errorf("write the request for term %d: %w", cur.Term, err)
	}
	// The row stays held (not renewed) until the requester has seen the
	// answer, or at most requestTTL: the leader reads it meanwhile.
	if _, err := store.BreakAcquisition(ctx, cand.Name, cand.Owner, cand.Token); err != nil {
		forgetRequest(ctx, store, req)
		return delivered{}, fmt.Errorf("wake the leader: %w", err)
	}
	return delivered{token: req.Token(), lease: req}, nil
}

// pending joins the request for term already under way if it asks what r
// asks, or says what it asks.
func pending(ctx context.Context, store *lease.Store, name string, term int64, r request) (delivered, error) {
	info, err := store.Get(ctx, name)
	if err != nil {
		return delivered{}, fmt.Errorf("read the request under way for term %d: %w", term, err)
	}
	var p request
	_ = json.Unmarshal(info.Metadata, &p)
	if info.Held && p.Action == r.Action && p.To == r.To {
		return delivered{token: info.Token}, nil
	}
	return delivered{}, fmt.Errorf("another request for term %d is under way (%s, to %q, from %s): try again once it is answered (within %v): %w",
		term, p.Action, p.To, p.From, requestTTL, lease.ErrHeld)
}

// forgetRequest releases the request row this requester took and deletes
// it (see forget), with a fresh bounded context.
func forgetRequest(ctx context.Context, store *lease.Store, req *lease.Lease) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
	defer cancel()
	if req.Release(ctx) == nil {
		_, _ = store.Forget(ctx, req.Name(), req.Token())
	}
}

// readRequest returns the request held for term, if any, with its row.
func readRequest(ctx context.Context, store *lease.Store, election string, term int64) (request, lease.Info, bool) {
	info, err := store.Get(ctx, requestName(election, term))
	if err != nil || !info.Held {
		return request{}, info, false
	}
	var r request
	if json.Unmarshal(info.Metadata, &r) != nil || (r.Action != actionResign && r.Action != actionHandOver) {
		return request{}, info, false
	}
	return r, info, true
}

// awaitTerm polls the election, with capped backoff, until a term later
// than term is held, or the leader refused the request (it broke the
// request's row, of token reqToken).
func awaitTerm(ctx context.Context, store *lease.Store, election string, term, reqToken int64) (Leader, error) {
	bo := backoff.Backoff{Min: 20 * time.Millisecond, Max: 500 * time.Millisecond}
	for {
		info, err := store.Get(ctx, leaseName(election))
		if err == nil && info.Held && info.Token > term {
			return leaderFromInfo(election, info), nil
		}
		if req, err := store.Get(ctx, requestName(election, term)); err == nil && req.Token != reqToken {
			return Leader{}, fmt.Errorf("leader: request in %q: the leader of term %d refused it (%w by its reading) and leads on", election, term, ErrNoCandidate)
		}
		if bo.Wait(ctx) != nil {
			return Leader{}, fmt.Errorf("leader: request in %q: delivered; no later term than %d held yet: %w", election, term, context.Cause(ctx))
		}
	}
}
