// Package reach lets a caller learn, while a call it made still waits,
// that the database answered it: a waiting advisory Lock or lease Acquire
// whose tries the server answers "held" has reached the database although
// it returns nothing yet. The leader package uses it to tell a candidate
// that waited behind a live leader from one that never reached the
// database.
package reach

import "context"

type key struct{}

// With returns a context whose calls report each answer of the database to
// answered, which must be cheap and safe for concurrent use.
func With(ctx context.Context, answered func()) context.Context {
	return context.WithValue(ctx, key{}, answered)
}

// Answered reports to ctx's function (see [With]), if any, that the
// database answered the call made with ctx.
func Answered(ctx context.Context) {
	if f, ok := ctx.Value(key{}).(func()); ok {
		f()
	}
}
