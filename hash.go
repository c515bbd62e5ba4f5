package pglocks

import (
	"errors"
	"fmt"
	"math/bits"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Space names one of PostgreSQL's two advisory-lock key spaces. A bigint key
// and a pair of int4 keys never conflict, even when their bits coincide:
// pg_locks tells them apart by objsubid (1 for bigint, 2 for the pair).
type Space uint8

const (
	// SpaceInt64 is the bigint space of pg_advisory_lock(bigint). Keys made
	// by [KeyOf], [Int64Key] and [Namespace.Key] live here.
	SpaceInt64 Space = 1
	// SpaceInt32Pair is the (int4, int4) space of
	// pg_advisory_lock(integer, integer). Keys made by [PairKey] live here.
	SpaceInt32Pair Space = 2
)

// String returns "int64" or "int32pair".
func (s Space) String() string {
	switch s {
	case SpaceInt64:
		return "int64"
	case SpaceInt32Pair:
		return "int32pair"
	default:
		return "Space(" + strconv.Itoa(int(s)) + ")"
	}
}

// Key identifies one PostgreSQL advisory lock. Make it with [KeyOf] (from a
// name), [Int64Key] (an explicit bigint) or [PairKey] (two int4s). The zero
// Key is invalid: [Key.Validate] reports it and the lock APIs refuse it.
//
// Key is a small comparable value; use it as a map key freely.
type Key struct {
	space Space
	v     int64  // the bigint, or for a pair hi<<32 | uint32(lo)
	name  string // the name hashed by KeyOf, if any
	named bool
}

// KeyOf maps name to a key in the bigint space. The value is exactly what
// PostgreSQL computes for hashtextextended(name, 0) on a little-endian server
// (x86-64, arm64 — every platform PostgreSQL is commonly run on), so a key
// taken through pglocks can be inspected or taken from psql:
//
//	select pg_try_advisory_lock(hashtextextended('report:monthly', 0));
//
// The algorithm is PostgreSQL's 64-bit Jenkins lookup3 hash (hash partitioning
// depends on it, so it does not change between server versions) and is pinned
// by golden values in this package's tests. It never changes in pglocks either.
//
// KeyOf computes a key for any string, but PostgreSQL text cannot hold every
// string: names that are empty, contain NUL bytes or are not valid UTF-8 make
// [Key.Validate] fail, and the lock APIs return that error instead of locking.
func KeyOf(name string) Key {
	return Key{space: SpaceInt64, v: int64(hashBytesExtended(name, 0)), name: name, named: true}
}

// Int64Key returns the bigint-space key v, as in pg_advisory_lock(v).
func Int64Key(v int64) Key {
	return Key{space: SpaceInt64, v: v}
}

// PairKey returns the key (hi, lo) in PostgreSQL's separate two-int4 space,
// as in pg_advisory_lock(hi, lo). PairKey(1, 2) and Int64Key(1<<32|2) are
// different locks.
func PairKey(hi, lo int32) Key {
	return Key{space: SpaceInt32Pair, v: int64(hi)<<32 | int64(uint32(lo))}
}

// Space reports which key space k lives in; 0 for the zero Key.
func (k Key) Space() Space { return k.space }

// Int64 returns the bigint key for pg_advisory_lock(bigint). For a [PairKey]
// it returns hi<<32 | lo as an identifier only: that bigint names a different
// lock; use [Key.Pair] and [Key.Space] to address the pair.
func (k Key) Int64() int64 { return k.v }

// Pair returns the two int4 keys of a [PairKey]; ok is false for other keys.
func (k Key) Pair() (hi, lo int32, ok bool) {
	if k.space != SpaceInt32Pair {
		return 0, 0, false
	}
	return int32(k.v >> 32), int32(uint32(k.v)), true
}

// Name returns the name k was made from by [KeyOf], and whether it was.
func (k Key) Name() (string, bool) { return k.name, k.named }

// LockTag returns the columns that identify k in pg_locks, where locktype is
// 'advisory': classid and objid hold the key's high and low 32 bits and
// objsubid is 1 for the bigint space, 2 for the int4-pair space.
func (k Key) LockTag() (classid, objid uint32, objsubid int16) {
	return uint32(uint64(k.v) >> 32), uint32(k.v), int16(k.space)
}

// SQL returns the arguments of pg_advisory_lock that take k, as text to paste
// into psql: "hashtextextended('report:monthly', 0)", "42" or "1, 2".
func (k Key) SQL() string {
	switch {
	case k.named:
		return "hashtextextended('" + strings.ReplaceAll(k.name, "'", "''") + "', 0)"
	case k.space == SpaceInt32Pair:
		hi, lo, _ := k.Pair()
		return strconv.Itoa(int(hi)) + ", " + strconv.Itoa(int(lo))
	default:
		return strconv.FormatInt(k.v, 10)
	}
}

// String describes k for logs and errors: `"report:monthly"(-6377036543226593914)`
// for a named key, the number for an [Int64Key], "(1,2)" for a [PairKey].
// Long names are shortened.
func (k Key) String() string {
	switch {
	case k.space == 0:
		return "Key(invalid)"
	case k.named:
		n := k.name
		if len(n) > 64 {
			n = n[:64] + "…"
		}
		return strconv.Quote(n) + "(" + strconv.FormatInt(k.v, 10) + ")"
	case k.space == SpaceInt32Pair:
		hi, lo, _ := k.Pair()
		return "(" + strconv.Itoa(int(hi)) + "," + strconv.Itoa(int(lo)) + ")"
	default:
		return strconv.FormatInt(k.v, 10)
	}
}

// ErrInvalidKey is wrapped by every error [Key.Validate] and [ValidateName]
// return.
var ErrInvalidKey = errors.New("pglocks: invalid key")

// Validate reports whether k can be locked: it fails for the zero Key and for
// a [KeyOf] name that [ValidateName] rejects. The error wraps [ErrInvalidKey].
func (k Key) Validate() error {
	if k.space != SpaceInt64 && k.space != SpaceInt32Pair {
		return fmt.Errorf("%w: zero Key (make keys with KeyOf, Int64Key or PairKey)", ErrInvalidKey)
	}
	if k.named {
		return ValidateName(k.name)
	}
	return nil
}

// ValidateName reports whether name can be stored in PostgreSQL text and so
// used as a lock or lease name: it must be non-empty, valid UTF-8 and free of
// NUL bytes. The error wraps [ErrInvalidKey] and says which rule failed.
func ValidateName(name string) error {
	switch {
	case name == "":
		return fmt.Errorf("%w: empty name", ErrInvalidKey)
	case strings.IndexByte(name, 0) >= 0:
		return fmt.Errorf("%w: name %q contains a NUL byte, which PostgreSQL text cannot hold", ErrInvalidKey, shorten(name))
	case !utf8.ValidString(name):
		return fmt.Errorf("%w: name %q is not valid UTF-8", ErrInvalidKey, shorten(name))
	}
	return nil
}

func shorten(s string) string {
	if len(s) > 64 {
		return s[:64] + "…"
	}
	return s
}

// Namespace keeps one part of an application's names apart from another
// (billing:… from reports:…) with the same hashing scheme as [KeyOf]: a name
// in a namespace is simply prefix + ":" + name, so psql reproduces its key as
// hashtextextended('billing:invoice:42', 0). Nested namespaces join with ":"
// too. The zero Namespace adds no prefix.
type Namespace struct {
	prefix string
}

// NewNamespace returns the namespace prefix. The prefix must pass
// [ValidateName]; the error names what is wrong with it.
func NewNamespace(prefix string) (Namespace, error) {
	if err := ValidateName(prefix); err != nil {
		return Namespace{}, fmt.Errorf("namespace prefix: %w", err)
	}
	return Namespace{prefix: prefix}, nil
}

// Prefix returns the namespace's prefix, "" for the zero Namespace.
func (ns Namespace) Prefix() string { return ns.prefix }

// Name returns the full name of name in ns: prefix + ":" + name. Use it for
// lease and election names, so they share the namespaces of advisory keys.
func (ns Namespace) Name(name string) string {
	if ns.prefix == "" {
		return name
	}
	return ns.prefix + ":" + name
}

// Key returns [KeyOf](ns.Name(name)).
func (ns Namespace) Key(name string) Key { return KeyOf(ns.Name(name)) }

// Sub returns the namespace nested under ns with the given part, whose names
// are ns.Name(part) + ":" + name. The part must pass [ValidateName].
func (ns Namespace) Sub(part string) (Namespace, error) {
	if err := ValidateName(part); err != nil {
		return Namespace{}, fmt.Errorf("namespace part: %w", err)
	}
	return Namespace{prefix: ns.Name(part)}, nil
}

// hashBytesExtended is PostgreSQL's hash_bytes_extended (src/common/hashfn.c),
// Bob Jenkins' lookup3 with a 64-bit seed, for a little-endian server. Both of
// PostgreSQL's code paths (aligned and unaligned input) give the same result
// on little-endian machines; this is the unaligned one, reading bytes.
func hashBytesExtended(k string, seed uint64) uint64 {
	length := uint32(len(k))
	a := 0x9e3779b9 + length + 3923095
	b, c := a, a
	if seed != 0 {
		a += uint32(seed >> 32)
		b += uint32(seed)
		a, b, c = mix(a, b, c)
	}
	for len(k) >= 12 {
		a += le32(k[0:4])
		b += le32(k[4:8])
		c += le32(k[8:12])
		a, b, c = mix(a, b, c)
		k = k[12:]
	}
	// The last 0–11 bytes; the lowest byte of c is reserved for the length
	// in lookup3, so c takes bytes 8–10 from its second byte up.
	switch len(k) {
	case 11:
		c += uint32(k[10]) << 24
		fallthrough
	case 10:
		c += uint32(k[9]) << 16
		fallthrough
	case 9:
		c += uint32(k[8]) << 8
		fallthrough
	case 8:
		b += uint32(k[7]) << 24
		fallthrough
	case 7:
		b += uint32(k[6]) << 16
		fallthrough
	case 6:
		b += uint32(k[5]) << 8
		fallthrough
	case 5:
		b += uint32(k[4])
		fallthrough
	case 4:
		a += uint32(k[3]) << 24
		fallthrough
	case 3:
		a += uint32(k[2]) << 16
		fallthrough
	case 2:
		a += uint32(k[1]) << 8
		fallthrough
	case 1:
		a += uint32(k[0])
	}
	_, b, c = final(a, b, c)
	return uint64(b)<<32 | uint64(c)
}

func le32(s string) uint32 {
	return uint32(s[0]) | uint32(s[1])<<8 | uint32(s[2])<<16 | uint32(s[3])<<24
}

func mix(a, b, c uint32) (uint32, uint32, uint32) {
	a -= c
	a ^= bits.RotateLeft32(c, 4)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 6)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 8)
	b += a
	a -= c
	a ^= bits.RotateLeft32(c, 16)
	c += b
	b -= a
	b ^= bits.RotateLeft32(a, 19)
	a += c
	c -= b
	c ^= bits.RotateLeft32(b, 4)
	b += a
	return a, b, c
}

func final(a, b, c uint32) (uint32, uint32, uint32) {
	c ^= b
	c -= bits.RotateLeft32(b, 14)
	a ^= c
	a -= bits.RotateLeft32(c, 11)
	b ^= a
	b -= bits.RotateLeft32(a, 25)
	c ^= b
	c -= bits.RotateLeft32(b, 16)
	a ^= c
	a -= bits.RotateLeft32(c, 4)
	b ^= a
	b -= bits.RotateLeft32(a, 14)
	c ^= b
	c -= bits.RotateLeft32(b, 24)
	return a, b, c
}
