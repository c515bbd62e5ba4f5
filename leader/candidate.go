package leader

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/internal/quietloss"
	"github.com/pglocks/pglocks/lease"
)

// Candidate is one running [Elector] of an election, as its candidate row
// shows it: a lease named "pglocks.leader:" + election + "#c:" + identity
// that the elector holds, kept alive by its Store, while Run is under way.
// Times are by the server clock.
type Candidate struct {
	// Election is the election's name.
	Election string
	// Identity is the candidate's Config.Identity.
	Identity string
	// Value is the candidate's value (Config.Value, or the last one it
	// proclaimed while leading).
	Value string
	// JoinedAt is when this candidacy began; LastSeen when its row was
	// last renewed.
	JoinedAt, LastSeen time.Time
	// Hostname and PID identify the candidate's process.
	Hostname string
	PID      int
	// Leading reports whether this candidate holds the election's current
	// term.
	Leading bool
}

// candidateMeta is the JSON of a candidate row.
type candidateMeta struct {
	Election string `json:"candidate"`
	Identity string `json:"identity"`
	Value    string `json:"value,omitempty"`
}

// candidateOf reads a candidate row's metadata.
func candidateOf(i lease.Info) (candidateMeta, bool) {
	var m candidateMeta
	err := json.Unmarshal(i.Metadata, &m)
	return m, err == nil
}

func candidatePrefix(election string) string { return leaseName(election) + candidateMark }

func candidateName(election, identity string) string { return candidatePrefix(election) + identity }

// Candidates returns the live candidates of election in store — every
// Elector whose Run is under way, on any process, whose candidate row has
// not expired — by identity. A candidate whose process died disappears
// once its row expires: within its Config.TTL of its last renewal (the
// Store renews it every TTL × RenewFraction). It needs no Elector: a
// status page or a deploy script can call it. ctx bounds two queries.
func Candidates(ctx context.Context, store *lease.Store, election string) ([]Candidate, error) {
	if err := checkRequestArgs(ctx, store, election); err != nil {
		return nil, fmt.Errorf("leader: candidates: %w", err)
	}
	infos, err := store.ListPrefix(ctx, candidatePrefix(election))
	if err != nil {
		return nil, fmt.Errorf("leader: candidates of %q: %w", election, err)
	}
	cur, err := store.Get(ctx, leaseName(election))
	if err != nil && !errors.Is(err, lease.ErrNotFound) {
		return nil, fmt.Errorf("leader: candidates of %q: %w", election, err)
	}
	l := leaderFromInfo(election, cur)
	out := make([]Candidate, 0, len(infos))
	for _, i := range infos {
		m, ok := candidateOf(i)
		if !ok || m.Election != election || candidateName(election, m.Identity) != i.Name {
			continue // another election's row that shares the prefix
		}
		out = append(out, Candidate{Election: election, Identity: m.Identity, Value: m.Value,
			JoinedAt: i.AcquiredAt, LastSeen: i.RenewedAt, Hostname: i.Hostname, PID: i.PID,
			Leading: l.Held && l.Identity == m.Identity})
	}
	return out, nil
}

// Candidates returns the election's live candidates; see [Candidates].
func (e *Elector) Candidates(ctx context.Context) ([]Candidate, error) {
	if err := e.usable(); err != nil {
		return nil, fmt.Errorf("leader: candidates: %w", err)
	}
	return Candidates(ctx, e.cfg.Store, e.cfg.Name)
}

// checkRequestArgs checks the arguments of the functions that need no
// Elector.
func checkRequestArgs(ctx context.Context, store *lease.Store, election string) error {
	switch {
	case ctx == nil:
		return errors.New("nil context")
	case store == nil:
		return errors.New("nil *lease.Store")
	}
	if err := checkElection(election); err != nil {
		return fmt.Errorf("election name: %w", err)
	}
	return nil
}

// Forms reserved in election names: an election's candidate rows are
// named leaseName(election) + candidateMark + identity and its requests
// leaseName(election) + requestMark + term, so an election whose name
// holds either form would share its lease row with another election's
// candidate or request.
const (
	candidateMark = "#c:"
	requestMark   = "#req:"
)

// checkElection checks an election's name: a valid name of at most
// maxNameLen bytes without the reserved forms.
func checkElection(name string) error {
	switch {
	case pglocks.ValidateName(name) != nil:
		return pglocks.ValidateName(name)
	case len(name) > maxNameLen:
		return fmt.Errorf("%d bytes, more than %d", len(name), maxNameLen)
	case strings.Contains(name, candidateMark), strings.Contains(name, requestMark):
		return fmt.Errorf("%q holds %q or %q, reserved for the lease rows of an election's candidates and requests", name, candidateMark, requestMark)
	}
	return nil
}

// candidacy returns this elector's candidate lease, nil if it holds none.
func (e *Elector) candidacy() *lease.Lease {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.cand
}

// ensureCandidate takes the candidate row unless this elector holds it:
// a lease kept alive by the Store's batched keep-alive. Its loss is a
// signal — a request to the leader breaks it (see [RequestResign]) — so
// the Store logs it at Debug (internal/quietloss) and the elector logs
// every loss itself, once, as soon as it fires: the leader's tend logs a
// request at Info, and any other loss (broken or deleted by someone
// else, a lapse, an unknown outcome) is logged at Warn by tend, by
// candidacyEnded or, if Run ends first, by leaveCandidacy. A row another
// process holds (two electors with one Identity) is logged at Warn once;
// the elector campaigns all the same but cannot be named in a hand-over
// nor be asked to resign. It returns only errors that retrying cannot
// cure.
//
// A try, once sent, is not cancelled by ctx: it ends within RetryInterval
// + 5s, and its caller waits. Cancelled on the wire — a campaign's wait
// that ends just then, a term that ends while tend retakes the row — its
// outcome would be unknown: the Store would clean the row up in the
// background and log a failure at Warn, and the row would be missing
// until the next try. ctx only decides whether a try begins.
func (e *Elector) ensureCandidate(ctx context.Context) error {
	if c := e.candidacy(); c != nil {
		if c.Err() == nil {
			return nil
		}
		if e.dropCandidacy(c) {
			e.lostCandidacy(c, "", true)
		}
	}
	if ctx.Err() != nil {
		// A campaign's wait that just ended: a try sent with a done ctx
		// would only count as a failed acquire in the Store's log.
		return nil
	}
	md, _ := json.Marshal(candidateMeta{Election: e.cfg.Name, Identity: e.cfg.Identity, Value: e.value()})
	tctx, cancel := e.stmt(context.WithoutCancel(ctx))
	defer cancel()
	ls, err := e.cfg.Store.TryAcquire(quietloss.With(tctx), candidateName(e.cfg.Name, e.cfg.Identity), e.cfg.TTL,
		lease.WithKeepAlive(), lease.WithMetadata(md))
	switch {
	case errors.Is(err, lease.ErrHeld):
		e.dupOnce.Do(func() {
			e.cfg.Logger.Warn("leader: another running elector has this Identity: this one is not listed as a candidate",
				"election", e.cfg.Name, "identity", e.cfg.Identity)
		})
		return nil
	case err != nil && fatal(err):
		return err
	case err != nil:
		e.cfg.Logger.Debug("leader: take candidate row", "election", e.cfg.Name, "err", err)
		return nil
	}
	e.mu.Lock()
	e.cand = ls
	e.mu.Unlock()
	context.AfterFunc(ls.Context(), func() { e.candidacyEnded(ls) })
	e.sweep(ctx)
	return nil
}

// candidacyEnded runs when the candidate lease c ends. Unless the
// leader's tend watches it (tend answers the request that may explain the
// loss), it forgets c and logs its loss at once (see lostCandidacy): no
// request breaks a follower's row. A c already forgotten was released,
// or its end was logged by whoever forgot it.
func (e *Elector) candidacyEnded(c *lease.Lease) {
	e.mu.Lock()
	mine := !e.tending && e.cand == c
	if mine {
		e.cand = nil
	}
	e.mu.Unlock()
	if mine {
		e.lostCandidacy(c, "", true)
	}
}

// lostCandidacy logs the end of the candidate lease c, which no request
// explains: at Warn if it was lost (the Store, told by internal/quietloss,
// logged it at Debug), at Debug otherwise (released, or its Store
// closed). why says what the elector found, if anything; again, that the
// elector will take the row again (Run goes on).
func (e *Elector) lostCandidacy(c *lease.Lease, why string, again bool) {
	err := c.Err()
	if !errors.Is(err, lease.ErrLost) {
		e.cfg.Logger.Debug("leader: candidate row ended", "election", e.cfg.Name, "row", c.Name(), "err", err)
		return
	}
	msg := "leader: candidate row lost"
	if again {
		msg += "; taking it again"
	}
	if why != "" {
		msg += " (" + why + ")"
	}
	e.cfg.Logger.Warn(msg, "election", e.cfg.Name, "identity", e.cfg.Identity, "row", c.Name(), "token", c.Token(), "err", err)
}

// ensureCandidateIfReached is ensureCandidate once a campaign step of
// this Run has reached the database: a candidate that cannot reach it
// says so once, in the campaign's words, not also in its Store's.
func (e *Elector) ensureCandidateIfReached(ctx context.Context, began time.Time) error {
	e.mu.Lock()
	reached := !e.reachedAt.Before(began)
	e.mu.Unlock()
	if !reached {
		return nil
	}
	return e.bounded(ctx, e.ensureCandidate)
}

// leaveCandidacy releases the candidate row, with a fresh bounded context,
// or logs its end if it has ended and no one has yet.
func (e *Elector) leaveCandidacy() {
	e.mu.Lock()
	c := e.cand
	e.cand = nil
	e.mu.Unlock()
	if c == nil {
		return
	}
	if c.Err() != nil {
		e.lostCandidacy(c, "", false)
		return
	}
	ctx, cancel := e.stmt(context.Background())
	defer cancel()
	err := c.Release(ctx)
	if err == nil {
		// Its token fences nothing: delete the row, so that a service
		// restarted with new identities does not grow the table.
		_, err = e.cfg.Store.Forget(ctx, c.Name(), c.Token())
	}
	if err != nil && !errors.Is(err, lease.ErrNotHeld) && !errors.Is(err, lease.ErrReleased) {
		e.cfg.Logger.Debug("leader: release candidate row", "election", e.cfg.Name, "err", err)
	}
}

// sweepEvery is how often an elector deletes its election's candidate and
// request rows idle for more than sweepIdle.
const (
	sweepEvery = time.Hour
	sweepIdle  = 24 * time.Hour
)

// sweep deletes, at most once per sweepEvery, the election's candidate and
// request rows whose expiry passed more than sweepIdle ago (a candidate
// that died, a request not released): only rows whose metadata names this
// election, so never another election's lease. Failures (no DELETE
// privilege, say) are logged at Debug: the rows stay, and Candidates
// skips them.
func (e *Elector) sweep(ctx context.Context) {
	if ctx.Err() != nil {
		return // its caller's ctx ended while the row's try went on: next time
	}
	e.mu.Lock()
	due := time.Since(e.sweptAt) >= sweepEvery
	if due {
		e.sweptAt = time.Now()
	}
	e.mu.Unlock()
	if !due {
		return
	}
	cm, _ := json.Marshal(map[string]string{"candidate": e.cfg.Name})
	rm, _ := json.Marshal(map[string]string{"election": e.cfg.Name})
	n, err := e.cfg.Store.ForgetIdle(ctx, candidatePrefix(e.cfg.Name), sweepIdle, cm)
	if err == nil {
		var m int64
		m, err = e.cfg.Store.ForgetIdle(ctx, leaseName(e.cfg.Name)+requestMark, sweepIdle, rm)
		n += m
	}
	e.cfg.Logger.Debug("leader: swept idle candidate and request rows", "election", e.cfg.Name, "deleted", n, "err", err)
}
