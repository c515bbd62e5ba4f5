// Package plant holds switches that plant known bugs in pglocks, so that
// the chaos suite can prove that its oracles report them: a history
// checker that has never failed proves nothing.
//
// Every switch is off unless a program calls [Set]; nothing reads them
// from the environment, and the package is internal, so no user of the
// module can turn one on. The chaos suite's worker processes (test code)
// call Set when their parent asks them to. Reading a switch is one atomic
// load.
package plant

import "sync/atomic"

// Bug is a planted bug; bugs combine as a bit set.
type Bug uint32

const (
	// GuardSkipsCheck makes lease's Guard accept every transaction without
	// checking the lease, locally or on the server: a write fenced by a
	// released or stale lease commits.
	GuardSkipsCheck Bug = 1 << iota
	// AsyncCommit brings back a bug once fixed: lease statements that
	// grant or extend ownership (acquire, renew, break; releases never
	// wait for their flush) commit with synchronous_commit = off, so a server
	// crash can lose an acquisition already answered, and hand its token
	// out again.
	AsyncCommit
)

var on atomic.Uint32

// Set plants bugs b (added to those already planted).
func Set(b Bug) { on.Or(uint32(b)) }

// On reports whether bug b is planted.
func On(b Bug) bool { return on.Load()&uint32(b) != 0 }

// Names maps each bug's name, as the chaos suite spells it, to the bug.
var Names = map[string]Bug{
	"guard-skips-check": GuardSkipsCheck,
	"async-commit":      AsyncCommit,
}
