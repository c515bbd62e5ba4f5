package lease

import (
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Values a store sends as text or jsonb are checked as the server checks
// them (in a UTF8 database), when they are given — New for Config.Hostname,
// before the statement for WithMetadata — so that a value the server would
// refuse is an error naming it, not a failed acquisition
// (TestServerRefusesWhatChecksRefuse pins the rules to the server's).

// checkText returns why the server would refuse s as text: a NUL byte, or
// bytes that are not UTF-8 (the client encoding).
func checkText(s string) error {
	switch {
	case strings.IndexByte(s, 0) >= 0:
		return errors.New("contains a NUL byte, which PostgreSQL text cannot hold")
	case !utf8.ValidString(s):
		return errors.New("is not valid UTF-8")
	}
	return nil
}

// numeric's range, which jsonb's numbers have: at most 131072 digits
// before the decimal point, 16383 after it; and the exponent parser's.
const (
	maxNumericPower = 131071 // the highest power of ten of a leading digit
	maxNumericScale = 16383
	maxExponent     = 1<<30 - 1 // INT_MAX/2
)

// checkJSON returns why PostgreSQL's jsonb would refuse doc: not JSON,
// bytes that are not UTF-8, a \u0000 escape (jsonb keeps strings as text),
// an unpaired UTF-16 surrogate escape, or a number outside numeric's range.
func checkJSON(doc []byte) error {
	switch {
	case !json.Valid(doc):
		return errors.New("not valid JSON")
	case !utf8.Valid(doc):
		return errors.New("not valid UTF-8")
	}
	for i := 0; i < len(doc); {
		var err error
		switch c := doc[i]; {
		case c == '"':
			i, err = checkString(doc, i+1)
		case c == '-' || c >= '0' && c <= '9':
			i, err = checkNumber(doc, i)
		default:
			i++
		}
		if err != nil {
			return err
		}
	}
	return nil
}

// checkString checks the escapes of the JSON string whose text starts at
// doc[i] (after its opening quote) and returns the index after it.
func checkString(doc []byte, i int) (int, error) {
	for ; doc[i] != '"'; i++ {
		if doc[i] != '\\' {
			continue
		}
		i++
		if doc[i] != 'u' {
			continue
		}
		r := hex4(doc[i+1:])
		i += 4
		switch {
		case r == 0:
			return 0, errors.New(`\u0000 in a string: jsonb cannot hold it`)
		case r >= 0xDC00 && r <= 0xDFFF:
			return 0, fmt.Errorf(`\u%04x: a low surrogate without its high one`, r)
		case r >= 0xD800 && r <= 0xDBFF:
			if i+6 >= len(doc) || doc[i+1] != '\\' || doc[i+2] != 'u' || !isLow(hex4(doc[i+3:])) {
				return 0, fmt.Errorf(`\u%04x: a high surrogate without its low one`, r)
			}
			i += 6
		}
	}
	return i + 1, nil
}

func isLow(r rune) bool { return r >= 0xDC00 && r <= 0xDFFF }

// hex4 reads the four hex digits of a \u escape (JSON already checked).
func hex4(b []byte) rune {
	v, _ := strconv.ParseUint(string(b[:4]), 16, 32)
	return rune(v)
}

// checkNumber checks that the JSON number at doc[i] fits numeric and
// returns the index after it.
func checkNumber(doc []byte, i int) (int, error) {
	start := i
	if doc[i] == '-' {
		i++
	}
	intStart := i
	for i < len(doc) && isDigit(doc[i]) {
		i++
	}
	intDigits := string(doc[intStart:i])
	var frac string
	if i < len(doc) && doc[i] == '.' {
		j := i + 1
		for i = j; i < len(doc) && isDigit(doc[i]); i++ {
		}
		frac = string(doc[j:i])
	}
	exp := 0
	if i < len(doc) && (doc[i] == 'e' || doc[i] == 'E') {
		j := i + 1
		for i = j; i < len(doc) && (isDigit(doc[i]) || doc[i] == '+' || doc[i] == '-'); i++ {
		}
		e, err := strconv.Atoi(string(doc[j:i]))
		if err != nil || e >= maxExponent || e <= -maxExponent {
			return 0, fmt.Errorf("number %.40s: its exponent is out of numeric's range", doc[start:i])
		}
		exp = e
	}
	if scale := len(frac) - exp; scale > maxNumericScale {
		return 0, fmt.Errorf("number %.40s: %d digits after the decimal point, numeric keeps at most %d", doc[start:i], scale, maxNumericScale)
	}
	digits := intDigits + frac
	if k := strings.IndexFunc(digits, func(r rune) bool { return r != '0' }); k >= 0 {
		if power := len(intDigits) - 1 - k + exp; power > maxNumericPower {
			return 0, fmt.Errorf("number %.40s: above numeric's range (10^%d, at most 10^%d)", doc[start:i], power, maxNumericPower)
		}
	}
	return i, nil
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }
