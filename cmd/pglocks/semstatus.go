package main

import (
	"context"
	"fmt"
	"io"
	"strconv"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/advisory"
)

// semaphoreRow is the advisory semaphore NAME: its permits held now.
type semaphoreRow struct {
	Name    string            `json:"name"`
	Held    int               `json:"held"`
	Permits []advisory.Permit `json:"permits"`
}

// semLabel follows NAME in the label of a semaphore's keys.
const semLabel = " (semaphore "

// labelSemaphore names the keys of the semaphore name in names: its
// slots, "NAME (semaphore permit I)", and its turnstile.
func labelSemaphore(names map[int64]string, name string) {
	for i := range advisory.MaxLimit {
		names[advisory.SlotKey(name, i).Int64()] = name + semLabel + "permit " + strconv.Itoa(i) + ")"
	}
	names[advisory.TurnstileKey(name).Int64()] = name + semLabel + "turnstile)"
}

// readSemaphore reads the permits of the semaphore name held now; nil if
// none is.
func readSemaphore(ctx context.Context, pool *pgxpool.Pool, name string) (*semaphoreRow, error) {
	ps, err := advisory.SemaphorePermits(ctx, pool, name)
	if err != nil || len(ps) == 0 {
		return nil, err
	}
	return &semaphoreRow{Name: name, Held: len(ps), Permits: ps}, nil
}

// printSemaphore prints the semaphore's section, if it has permits held.
func printSemaphore(tw io.Writer, sem *semaphoreRow) {
	if sem == nil {
		return
	}
	fmt.Fprintf(tw, "SEMAPHORE %s\n", sem.Name)
	fmt.Fprintf(tw, "  %d permits held\n", sem.Held)
	fmt.Fprintln(tw, "  SLOT\tBACKEND PID\tAPPLICATION\tCLIENT")
	for _, p := range sem.Permits {
		fmt.Fprintf(tw, "  %d\t%d\t%s\t%s\n", p.Slot, p.PID, p.ApplicationName, p.ClientAddr)
	}
}
