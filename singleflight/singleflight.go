// Package singleflight runs a function once across processes for
// concurrent calls with the same key (seed 004's deduplication): the first
// caller takes the key's advisory lock, computes, and stores the result
// with a TTL; the others wait on the lock and then read the stored result
// instead of computing it again. Later calls read it until it expires.
//
// Results are stored by a [Results] implementation: [Table] keeps them in
// a PostgreSQL table; any other cache (Redis, memcached, a blob store) can
// implement the two methods.
//
// What it guarantees: while a result is stored and unexpired, fn does not
// run again for its key; two calls never run fn for one key at the same
// time while the lock is held (the lock is exclusive across every process
// on the database). What it does not: an fn whose lock is lost mid-way
// (its session died) may overlap a second one — its ctx is cancelled and
// its result is not stored; errors are not stored, so the next caller runs
// fn again.
package singleflight

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/pglocks/pglocks"
	"github.com/pglocks/pglocks/advisory"
)

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
func (g *Group) Do(ctx context.Context, key string, fn func(ctx context.Context) ([]byte, error)) ([]byte, Source, error) {
	if err := g.check(ctx, fn); err != nil {
		return nil, 0, err
	}
	name := g.prefix() + key
	if v, ok, err := g.Results.Get(ctx, name); err != nil || ok {
		return v, Hit, wrap(key, "get", err)
	}
	var (
		value []byte
		from  = Waited
	)
	err := g.Locker.Do(ctx, pglocks.KeyOf(name), func(ctx context.Context) error {
		v, ok, err := g.Results.Get(ctx, name) // the holder before us may have stored it
		if err != nil || ok {
			value = v
			return wrap(key, "get", err)
		}
		if value, err = fn(ctx); err != nil {
			return err
		}
		from = Computed
		if ctx.Err() != nil { // the lock was lost: another call may be computing
			return context.Cause(ctx)
		}
		return wrap(key, "put", g.Results.Put(ctx, name, value, g.TTL))
	})
	if err != nil {
		return nil, from, err
	}
	return value, from, nil
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
