package leader_test

import (
	"os"
	"testing"

	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	if os.Getenv("LEADER_BURN") != "" {
		burn()
	}
	if runChild() {
		return
	}
	goleak.VerifyTestMain(pgtest.WrapMain(m))
}
