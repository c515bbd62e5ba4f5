package otelpglocks_test

import (
	"context"
	"log"
	"testing"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/pglocks/pglocks/pgtest"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) {
	goleak.VerifyTestMain(closing{pgtest.WrapMain(m)})
}

// closing stops the Example functions' server after the tests ran.
type closing struct{ m interface{ Run() int } }

func (c closing) Run() int {
	defer func() {
		if err := pgtest.CloseExampleServer(); err != nil {
			log.Print(err)
		}
	}()
	return c.m.Run()
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

type pgxPool = *pgxpool.Pool
