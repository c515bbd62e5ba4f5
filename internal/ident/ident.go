// Package ident checks SQL identifiers that pglocks takes from
// configuration: schema, table and channel names.
package ident

import "fmt"

// MaxLen is PostgreSQL's identifier limit (NAMEDATALEN − 1), in bytes.
const MaxLen = 63

// Check accepts plain identifiers only — ASCII letters, digits and
// underscores, not starting with a digit, at most MaxLen bytes — so that no
// configuration can smuggle SQL in (they are quoted too) or depend on case
// folding. The error says what is wrong.
func Check(s string) error {
	if s == "" {
		return fmt.Errorf("empty identifier")
	}
	if len(s) > MaxLen {
		return fmt.Errorf("identifier %q is longer than %d bytes", s, MaxLen)
	}
	for i, r := range s {
		switch {
		case r == '_', r >= 'a' && r <= 'z', r >= 'A' && r <= 'Z':
		case r >= '0' && r <= '9' && i > 0:
		default:
			return fmt.Errorf("identifier %q may hold only ASCII letters, digits and underscores, not starting with a digit", s)
		}
	}
	return nil
}
