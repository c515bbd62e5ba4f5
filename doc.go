// Package pglocks is a toolkit for distributed locks, leases and leader
// election on PostgreSQL, built on pgx/v5.
//
// This root package maps names to advisory-lock keys. [KeyOf] reproduces
// PostgreSQL's own hashtextextended(name, 0), so a key taken from Go can be
// inspected or taken from psql, and keys never change between pglocks or
// server versions. [Int64Key] and [PairKey] address PostgreSQL's bigint and
// two-int4 advisory-lock spaces directly; a [Namespace] keeps one part of an
// application's names apart from another's.
//
// The primitives live in subpackages:
//
//   - advisory: session- and transaction-scoped advisory locks on keys.
//   - lease: rows with an owner, a TTL judged by the database clock and a
//     fencing token that only grows.
//   - leader: leader election built on both.
//   - pgtest: a real PostgreSQL for tests, with fault injection.
package pglocks
