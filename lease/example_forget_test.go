package lease_test

import (
	"context"
	"encoding/json"
	"fmt"
	"log"
	"time"

	"github.com/pglocks/pglocks/lease"
)

// A membership row — who is in a group now, fencing nothing — is deleted
// once its member leaves, and rows of members that died are swept later.
func ExampleStore_Forget() {
	ctx := context.Background()
	pool, done := examplePool()
	defer done()
	store, err := lease.New(pool, lease.Config{})
	if err != nil {
		log.Fatal(err)
	}
	defer store.Close(ctx)
	if err := store.Migrate(ctx); err != nil {
		log.Fatal(err)
	}

	md, _ := json.Marshal(map[string]string{"group": "workers"})
	l, err := store.TryAcquire(ctx, "workers/member:host-1", 30*time.Second, lease.WithMetadata(md))
	if err != nil {
		log.Fatal(err)
	}
	if err := l.Release(ctx); err != nil {
		log.Fatal(err)
	}
	deleted, err := store.Forget(ctx, l.Name(), l.Token())
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("deleted:", deleted)

	// The sweep: rows of the group expired more than a day ago.
	n, err := store.ForgetIdle(ctx, "workers/member:", 24*time.Hour, md)
	if err != nil {
		log.Fatal(err)
	}
	fmt.Println("swept:", n)
	// Output:
	// deleted: true
	// swept: 0
}
