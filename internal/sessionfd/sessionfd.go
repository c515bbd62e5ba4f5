// Package sessionfd hands cmd/pglocks a duplicate of the socket of the
// database session that holds an advisory lock, without an exported API in
// package advisory: `pglocks run` gives it to the supervisor of its job, so
// that the server sees the session end (and frees the lock) only once the
// supervisor has exited, after the job, even if pglocks is SIGKILLed.
//
// It imports neither advisory nor cmd/pglocks; advisory sets File in its
// init.
package sessionfd

import "os"

// File returns a new file descriptor, close-on-exec, for the socket of the
// session that holds lock (an *advisory.Lock), or an error that says why
// it cannot (not a held lock; a connection that is no socket). The caller
// owns the file and must never read or write it: holding it open is its
// only use. Package advisory sets File in its init on Linux; it is nil
// elsewhere, and when advisory is not linked.
var File func(lock any) (*os.File, error)
