package pgtest

import (
	"context"
	"sync"
)

// examples is the server of a test binary's Example functions.
var examples struct {
	mu  sync.Mutex
	srv *Server
	err error
}

// ExampleDSN returns the DSN of a fresh database for an Example function
// (which has no testing.TB for [New]). The first call starts a server,
// as [Start] does, or joins the local server of this go test's test
// binaries as [SharedServer] does; later calls reuse it. [Main] and [WrapMain] close it
// when the tests ran; else call [CloseExampleServer].
func ExampleDSN(ctx context.Context) (string, error) {
	examples.mu.Lock()
	defer examples.mu.Unlock()
	if examples.srv == nil && examples.err == nil {
		examples.srv, examples.err = start(ctx, newConfig(nil), true)
	}
	if examples.err != nil {
		return "", examples.err
	}
	db, err := examples.srv.CreateDatabase(ctx)
	if err != nil {
		return "", err
	}
	return db.DSN, nil
}

// CloseExampleServer stops the server ExampleDSN started, if any.
func CloseExampleServer() error {
	examples.mu.Lock()
	defer examples.mu.Unlock()
	if examples.srv == nil {
		return nil
	}
	err := examples.srv.Close()
	examples.srv = nil
	return err
}
