package singleflight

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
	"github.com/pglocks/pglocks/internal/outcome"
)

// ErrNotStored is wrapped by [Group.Do]'s error when fn returned a value
// that was not stored: the lock was lost before the store, or the store
// failed. [Table.PutHeld] returns it (with [advisory.ErrLost]) when the
// lock's session no longer holds the lock.
var ErrNotStored = errors.New("singleflight: result not stored")

// ErrStoreUnknown is wrapped by [Group.Do]'s error when the store of fn's
// value was sent but not answered (the connection broke, ctx ended): the
// value may or may not be stored. With a [Table]
// it is stored only if the store's own check, whenever it ran, found the
// lock's session holding the key.
var ErrStoreUnknown = errors.New("singleflight: store outcome unknown: the result may have been stored")

// Results stores results by key, each with a TTL.
type Results interface {
	// Get returns the unexpired result stored for key; ok is false when
	// there is none.
	Get(ctx context.Context, key string) (value []byte, ok bool, err error)
	// Put stores value for key until ttl has passed, replacing any.
	Put(ctx context.Context, key string, value []byte, ttl time.Duration) error
}

// Source says where [Group.Do]'s value came from.
type Source int

const (
	// Hit: the result was stored already.
	Hit Source = iota
	// Waited: another call stored it while this one waited for the lock.
	Waited
	// Computed: this call ran fn.
	Computed
)

// String returns "hit", "waited" or "computed".
func (s Source) String() string {
	switch s {
	case Hit:
		return "hit"
	case Waited:
		return "waited"
	case Computed:
		return "computed"
	}
	return fmt.Sprintf("Source(%d)", int(s))
}

// Group deduplicates calls. Its fields are read on every call; set them
// before the first.
type Group struct {
	// Locker takes the keys' locks. Required.
	Locker *advisory.Locker
	// Results stores the results. Required.
	Results Results
	// TTL is how long a result is kept. Required, positive.
	TTL time.Duration
	// Prefix is put before each key, in its lock's name and its stored
	// key, so that groups do not share keys. Default: "singleflight:".
	Prefix string
}

var errNilGroup = errors.New("singleflight: nil *Group")

// Do returns the result for key: the stored one if any, else fn's, which
// it stores for TTL. Concurrent calls for one key, in any process, wait
// on the key's lock (ctx bounds the wait) and then read what the first
// stored; fn runs under the lock, with a ctx cancelled if the lock is
// lost. fn's error is returned, not stored.
//
// fn's result is stored only if the lock was still held after fn
// returned: checked by the store's own statement when Results is a
// *[Table], else by a round trip on the lock's session just before
// Put (see the package doc for what each leaves open). When it was not,
// Do returns an error wrapping [ErrNotStored] and [advisory.ErrLost]; a
// store that failed, an error wrapping [ErrNotStored]; a store whose
// outcome is unknown, an error wrapping [ErrStoreUnknown]. With any
// error the value returned is nil.
func (g *Group) Do(ctx context.Context, key string, fn func(ctx context.Context) ([]byte, error)) ([]byte, Source, error) {
	if err := g.check(ctx, fn); err != nil {
		return nil, 0, err
	}
	name := g.prefix() + key
	if v, ok, err := g.Results.Get(ctx, name); err != nil || ok {
		return v, Hit, wrap(key, "get", err)
	}
	lk, err := g.Locker.Lock(ctx, pglocks.KeyOf(name))
	if err != nil {
		return nil, Waited, err
	}
	value, from, err := g.locked(ctx, lk, key, name, fn)
	if err != nil {
		return nil, from, err
	}
	return value, from, nil
}

// locked does Do's work under lk, and unlocks lk even if fn panics.
func (g *Group) locked(ctx context.Context, lk *advisory.Lock, key, name string, fn func(context.Context) ([]byte, error)) (value []byte, from Source, err error) {
	defer func() { err = errors.Join(err, g.unlock(ctx, lk)) }()
	v, ok, err := g.Results.Get(ctx, name) // the holder before us may have stored it
	if err != nil || ok {
		return v, Waited, wrap(key, "get", err)
	}
	fctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	defer context.AfterFunc(lk.Context(), func() { cancel(context.Cause(lk.Context())) })()
	value, err = fn(fctx)
	from = Waited
	if err == nil {
		from = Computed
	}
	if lerr := lk.Err(); lerr != nil { // another call may be computing
		return nil, from, errors.Join(fmt.Errorf("%w (key %q): the lock was lost while fn ran: %w", ErrNotStored, key, lerr), err)
	}
	if err != nil {
		return nil, from, err
	}
	return value, from, g.store(ctx, lk, key, name, value)
}

// store stores fn's value: fenced by lk in the same statement when
// Results can do that, else after one answered round trip on lk's session.
func (g *Group) store(ctx context.Context, lk *advisory.Lock, key, name string, value []byte) error {
	var err error
	// Only a *Table itself is fenced in its statement: a wrapper that
	// embeds one (to prefix, compress or encrypt) has its own Put, which
	// the Table's promoted PutHeld would bypass.
	if t, ok := g.Results.(*Table); ok {
		err = t.PutHeld(ctx, lk, name, value, g.TTL)
	} else if err = lk.Verify(ctx); err != nil {
		return fmt.Errorf("%w (key %q): the lock was not verified after fn returned: %w", ErrNotStored, key, err)
	} else {
		err = g.Results.Put(ctx, name, value, g.TTL)
	}
	switch {
	case err == nil, errors.Is(err, ErrNotStored), errors.Is(err, ErrStoreUnknown):
		return err
	case outcome.Of(err) == outcome.Unknown:
		return fmt.Errorf("%w (key %q): %w", ErrStoreUnknown, key, err)
	}
	return fmt.Errorf("%w (key %q): put: %w", ErrNotStored, key, err)
}

// unlock releases lk unless it has ended already: a lock lost before the
// store made Do's error say so; one lost after it leaves the stored
// result as valid as before.
func (g *Group) unlock(ctx context.Context, lk *advisory.Lock) error {
	if lk.Err() != nil {
		return nil
	}
	uctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), g.Locker.Config().QueryTimeout)
	defer cancel()
	if err := lk.Unlock(uctx); err != nil && lk.Err() == nil {
		return err
	}
	return nil
}

func (g *Group) check(ctx context.Context, fn func(context.Context) ([]byte, error)) error {
	switch {
	case g == nil:
		return errNilGroup
	case ctx == nil:
		return errors.New("singleflight: nil context")
	case fn == nil:
		return errors.New("singleflight: nil function")
	case g.Locker == nil:
		return errors.New("singleflight: Group.Locker is nil")
	case g.Results == nil:
		return errors.New("singleflight: Group.Results is nil")
	case g.TTL <= 0:
		return fmt.Errorf("singleflight: Group.TTL must be positive, got %v", g.TTL)
	}
	return nil
}

func (g *Group) prefix() string {
	if g.Prefix == "" {
		return "singleflight:"
	}
	return g.Prefix
}

func wrap(key, op string, err error) error {
	if err == nil {
		return nil
	}
	return fmt.Errorf("singleflight: %s %q: %w", op, key, err)
}
