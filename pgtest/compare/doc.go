// Package compare runs one user's suite — 20 parallel tests, each with its
// own database of a few migrated tables — with pgtest and with
// github.com/peterldowns/pgtestdb against the same server, interleaved,
// and reports per-test database p50/p95 and suite wall time. It is a
// module of its own, so that pglocks does not depend on pgtestdb, and it is
// not part of pglocks' test suite:
//
//	cd pgtest/compare && PGTEST_COMPARE=3 PGTEST_DOCKER=0 go test -run TestCompare -v
//
// PGTEST_COMPARE is the number of rounds; the server is PGTEST_DSN's, else
// one that pgtest starts (Docker, else local binaries).
package compare
