package schedule

import (
	"time"

	"github.com/jackc/pgx/v5/pgtype"
)

// slotKeyLayout is the layout of [SlotKey]: RFC 3339 in UTC with exactly
// six fractional digits (the server's precision), so that keys have one
// length and sort as text in time order.
const slotKeyLayout = "2006-01-02T15:04:05.000000Z07:00"

// SlotKey returns the slot key of t: t in UTC, RFC 3339 with microseconds,
// as in "2026-11-23T04:00:00.000000Z" — the key [Job.Start] gives a period
// slot (its start), and the key to pass to [Job.StartSlot] for a tick
// whose scheduler knows its time. Every instant has one key, whatever
// t's zone or the digits it was spelled with (nanoseconds are truncated),
// and keys of one length sort as text in time order. Explicit keys are
// opaque text to StartSlot: "2026-11-23T04:00:00Z" and
// "2026-11-23T05:00:00+01:00" are two slots there, SlotKey gives one.
//
// Period slots started by earlier versions have keys without trailing
// zeros ("2026-11-23T04:00:29.6Z"); a Start finds their runs by the slot's
// start all the same.
func SlotKey(t time.Time) string { return t.UTC().Format(slotKeyLayout) }

// slot is what a Start decided: the slot's key and, for a period slot,
// its start and the end of its window, with the server time of the
// decision and the local time its reply came.
type slot struct {
	key    string
	start  time.Time // period slots: the slot's start (server clock)
	closes time.Time // period slots: start + Period − Tolerance (server clock)
	every  bool      // an AtLeast-only job: the key is the decision's time
	at     time.Time // server clock
	local  time.Time // time.Now() when the reply came
}

// same reports whether key, the slot a run's lease names, is sl: the same
// text, or for a period slot the same start spelled by another version.
func (sl slot) same(key string) bool {
	if key == sl.key {
		return true
	}
	if sl.start.IsZero() {
		return false
	}
	t, err := time.Parse(time.RFC3339Nano, key)
	return err == nil && t.Equal(sl.start)
}

// startArg is the slot's start as a statement's argument: null for a slot
// that is not a period slot.
func (sl slot) startArg() pgtype.Timestamptz {
	if sl.start.IsZero() {
		return pgtype.Timestamptz{}
	}
	return pgtype.Timestamptz{Time: sl.start, Valid: true}
}
