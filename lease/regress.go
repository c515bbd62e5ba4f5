package lease

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/google/uuid"
	"github.com/jackc/pgx/v5"
	"github.com/pglocks/pglocks/internal/outcome"
)

// ErrTokenRegressed is wrapped by the error of an acquisition refused
// because the server handed out a token no higher than one this Store had
// already seen for the name: the server's fencing counter went back, as
// after a failover to an asynchronous standby that lacked recent commits.
// See [RegressionError].
var ErrTokenRegressed = errors.New("lease: token regressed")

// RegressionError is the error of a [Store.TryAcquire] or [Store.Acquire]
// whose acquisition the server granted with token Token although the Store
// had already seen token Seen ≥ Token for Name before it sent the
// statement. The acquisition is refused: the Store releases it and raises
// the row's counter to Seen, so that the next acquisition gets a token
// above every token this Store has seen. errors.Is(err, ErrTokenRegressed)
// reports true for it.
type RegressionError struct {
	// Name is the lease's name.
	Name string
	// Token is the token the server handed out.
	Token int64
	// Seen is the highest token the Store had seen for Name.
	Seen int64
}

// Error describes the regression.
func (e *RegressionError) Error() string {
	if e == nil {
		return "lease: nil *RegressionError"
	}
	return fmt.Sprintf("lease %q: the server handed out token %d, but this store had seen token %d: "+
		"the fencing counter went back (a failover to a standby that lacked recent commits?); acquisition refused",
		e.Name, e.Token, e.Seen)
}

// Is reports whether target is [ErrTokenRegressed].
func (e *RegressionError) Is(target error) bool { return target == ErrTokenRegressed }

// tokenMemory is the highest token a Store has seen per name: its own
// acquisitions', the holders' in HeldErrors, those Get read and Break
// set; and the token of the last acquisition the Store itself released,
// which tells the acquire statement that the row is likely free (see
// fastSQL). Its zero value is empty and ready.
type tokenMemory struct {
	mu sync.Mutex
	m  map[string]tokens
}

type tokens struct{ max, freed int64 }

// get returns the highest token seen for name, 0 if none, and whether the
// last thing the store knows of the row is its own release of that token:
// a hint, which another store's acquisition may have made stale.
func (m *tokenMemory) get(name string) (seen int64, free bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	t := m.m[name]
	return t.max, t.max > 0 && t.freed == t.max
}

// known returns the highest token seen for each of names that has one.
func (m *tokenMemory) known(names []string) map[string]int64 {
	m.mu.Lock()
	defer m.mu.Unlock()
	seen := make(map[string]int64)
	for _, name := range names {
		if t := m.m[name]; t.max > 0 {
			seen[name] = t.max
		}
	}
	return seen
}

// observe records that token was seen for name.
func (m *tokenMemory) observe(name string, token int64) {
	m.update(name, func(t *tokens) { t.max = max(t.max, token) })
}

// released records that the store released the acquisition of token.
func (m *tokenMemory) released(name string, token int64) {
	m.update(name, func(t *tokens) { t.max, t.freed = max(t.max, token), token })
}

// stale drops the hint that the store released name last, given when the
// highest token seen was seen: a try found the row not released (taken by
// another client since, or the release was lost in a crash or a failover).
func (m *tokenMemory) stale(name string, seen int64) {
	m.update(name, func(t *tokens) {
		if t.max == seen {
			t.freed = 0
		}
	})
}

func (m *tokenMemory) update(name string, f func(*tokens)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.m == nil {
		m.m = make(map[string]tokens)
	}
	t := m.m[name]
	f(&t)
	m.m[name] = t
}

// checkGranted refuses an acquisition of token when the store had seen a
// token ≥ token for name before the acquire statement was sent
// (seenBefore): a correct server always hands out a higher one then, since
// every token seen had committed before the statement ran. Comparing with
// what was seen before sending, not now, keeps a takeover that a slow
// reply raced from looking like a regression. A refused acquisition is
// released with the row's counter raised to seenBefore; should that fail,
// it is retried in the background. The caller must be inside enter/exit.
func (s *Store) checkGranted(ctx context.Context, name string, owner uuid.UUID, token, seenBefore int64, ttl time.Duration) error {
	if token > seenBefore {
		s.seen.observe(name, token)
		return nil
	}
	raise := func(ctx context.Context) error {
		_, err := s.pool.Exec(ctx, raiseSQL(s.cfg), name, pgUUID(owner), token, seenBefore,
			s.q.channel, interestKey(s.q.channel, name))
		return err
	}
	if err := raise(ctx); outcome.Of(err) != outcome.OK {
		s.settle(ttl, raise)
	}
	// Fatal: Acquire returns it rather than retry past it silently.
	return outcome.MarkFatal(&RegressionError{Name: name, Token: token, Seen: seenBefore})
}

// raiseSQL releases the acquisition (name $1, owner $2, token $3) with the
// row's token raised to $4, notifying waiters as a release does.
func raiseSQL(cfg Config) string {
	return strings.NewReplacer("{T}", pgx.Identifier{cfg.Schema, cfg.Table}.Sanitize(), "{DURABLE}", durable).Replace(`with {DURABLE}
update {T} set owner = null, expires_at = clock_timestamp(), token = greatest(token, $4::bigint)
where name = $1 and owner = $2 and token = $3 and exists (select from durable)
returning case when pg_catalog.pg_try_advisory_xact_lock($6::bigint) then null else pg_notify($5, ` + releasedPayload + `) end`)
}
