package gooselock_test

import (
	"os"
	"testing"

	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if dsn := os.Getenv(childDSN); dsn != "" {
		os.Exit(child(dsn))
	}
	goleak.VerifyTestMain(pgtest.WrapMain(m), goleak.IgnoreTopFunction("database/sql.(*DB).connectionOpener"))
}
