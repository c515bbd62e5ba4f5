// Package httplock is net/http middleware that serializes requests per
// resource across every instance of a service (distributed lock
// middleware): a function of the request names the lock, or none;
// while another request anywhere holds it the answer is 429 Too Many
// Requests with a Retry-After header and a small application/problem+json
// body. The lock is released when the handler returns, also when it
// panics, and the handler's context is cancelled if the lock is lost.
//
// A release that fails does not strand the resource: an advisory unlock
// the server refused is tried again within Config.ReleaseTimeout (a
// refusal that outlasts it leaves the lock held with its session); a
// lease's release that could not be sent (the server restarting) ends the
// lease all the same and goes on in the lease store's background, so its
// row is freed once the server answers, or expires at the end of its TTL.
//
// Locks come from a [Source]: [Advisory] (session advisory locks, held as
// long as the Locker's session) or [Lease] (leases kept alive while the
// handler runs, whose busy answers carry the holder's time left as
// Retry-After).
//
// What it guarantees: two requests that name the same lock never run
// their handlers at the same time while the lock is held, across every
// instance on the same database. What it does not: a handler that goes on
// after its context is cancelled (lost lock) is not stopped; fence its
// writes (lease.Lease.Guard) if that matters.
package httplock

import (
	"context"
	"encoding/json"
	"errors"
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/pglocks/pglocks/internal/backoff"
)

// DefaultRetryAfter is Config.RetryAfter unless set.
const DefaultRetryAfter = time.Second

// Config configures [New].
type Config struct {
	// Source takes the locks. Required.
	Source Source

	// Lock names the lock a request needs; ok false lets the request
	// through without one. Required.
	Lock func(r *http.Request) (name string, ok bool)

	// MaxWait is how long a request waits for a busy lock before the 429.
	// Default: 0, no wait (one try).
	MaxWait time.Duration

	// RetryAfter is the Retry-After of a 429 when the Source does not
	// know how long the holder keeps the lock. Rounded up to whole
	// seconds, at least 1. Default: 1s.
	RetryAfter time.Duration

	// OnError answers a request whose lock could not be taken for another
	// reason than busy (the database is down, say). Default: 503 with a
	// problem+json body.
	OnError func(w http.ResponseWriter, r *http.Request, err error)

	// ReleaseTimeout bounds the release after the handler returned,
	// retries included: a release that fails while the lock is still held
	// (an advisory unlock the server refused) is tried again with backoff
	// until then. A lease's release that could not be sent (the server
	// restarting) goes on in the lease store's background after that (see
	// lease.Lease.Release). Default: 5s.
	ReleaseTimeout time.Duration
}

// New returns the middleware, or an error naming the Config field that is
// missing or wrong.
func New(cfg Config) (func(http.Handler) http.Handler, error) {
	switch {
	case cfg.Source == nil:
		return nil, errors.New("httplock: Config.Source is nil")
	case cfg.Lock == nil:
		return nil, errors.New("httplock: Config.Lock is nil")
	case cfg.MaxWait < 0 || cfg.RetryAfter < 0 || cfg.ReleaseTimeout < 0:
		return nil, errors.New("httplock: Config.MaxWait, RetryAfter and ReleaseTimeout must not be negative")
	}
	if cfg.RetryAfter == 0 {
		cfg.RetryAfter = DefaultRetryAfter
	}
	if cfg.ReleaseTimeout == 0 {
		cfg.ReleaseTimeout = 5 * time.Second
	}
	if cfg.OnError == nil {
		cfg.OnError = func(w http.ResponseWriter, _ *http.Request, err error) {
			problem(w, http.StatusServiceUnavailable, "the resource's lock could not be taken; retry later")
		}
	}
	return func(next http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { serve(cfg, next, w, r) })
	}, nil
}

func serve(cfg Config, next http.Handler, w http.ResponseWriter, r *http.Request) {
	name, ok := cfg.Lock(r)
	if !ok {
		next.ServeHTTP(w, r)
		return
	}
	actx, cancel := r.Context(), context.CancelFunc(func() {})
	if cfg.MaxWait > 0 {
		actx, cancel = context.WithTimeout(actx, cfg.MaxWait)
	}
	held, err := cfg.Source.Acquire(actx, name, cfg.MaxWait > 0)
	cancel()
	var busy *BusyError
	switch {
	case errors.As(err, &busy) || errors.Is(err, ErrBusy):
		after := cfg.RetryAfter
		if busy != nil && busy.RetryAfter > 0 {
			after = busy.RetryAfter
		}
		w.Header().Set("Retry-After", strconv.Itoa(seconds(after)))
		problem(w, http.StatusTooManyRequests, "the resource is being changed by another request; retry later")
		return
	case err != nil:
		cfg.OnError(w, r, err)
		return
	}
	// Deferred calls run in reverse, also on panic: the handler's context
	// ends first, then the lock is released.
	defer release(cfg, held, r)
	ctx, cancelCause := context.WithCancelCause(r.Context())
	defer cancelCause(nil)
	defer context.AfterFunc(held.Context(), func() { cancelCause(context.Cause(held.Context())) })()
	next.ServeHTTP(w, r.WithContext(ctx))
}

// release gives held up within cfg.ReleaseTimeout. A release that fails
// while the lock is still held (its Context not done) is tried again with
// backoff until then: an advisory unlock the server refused (a revoked
// privilege, an operator's pg_cancel_backend) leaves the lock held on its
// session, and the resource would be answered 429 for as long as the
// session lives. A lease's Release ends the lease whatever its outcome
// (lease.Lease.Release), so it is tried once: a release that could not be
// sent goes on in the lease store's background.
func release(cfg Config, held Held, r *http.Request) {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(r.Context()), cfg.ReleaseTimeout)
	defer cancel()
	var bo backoff.Backoff
	for held.Release(ctx) != nil && held.Context().Err() == nil {
		if bo.Wait(ctx) != nil {
			return
		}
	}
}

// seconds rounds d up to whole seconds, at least 1.
func seconds(d time.Duration) int {
	return max(1, int(math.Ceil(d.Seconds())))
}

// problem writes an RFC 9457 problem+json answer.
func problem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail,
	})
}
