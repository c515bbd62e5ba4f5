// Package quietloss lets package leader tell package lease, without an
// exported option, that a lease's loss is reported by its holder: a lease
// acquired with a context from [With] has its loss logged by the Store at
// Debug instead of Warn. Package leader uses it for its candidate rows
// only, and then logs every loss of such a row itself — at Info when a
// request to the leader explains it, at Warn otherwise. Everything else
// about the loss (Lost, Context, Err, the Observer's End event) is as for
// any lease.
package quietloss

import "context"

type key struct{}

// With returns ctx marked so that a lease acquired with it is quiet.
func With(ctx context.Context) context.Context { return context.WithValue(ctx, key{}, true) }

// Is reports whether ctx was marked by With.
func Is(ctx context.Context) bool {
	q, _ := ctx.Value(key{}).(bool)
	return q
}
