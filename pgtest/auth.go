package pgtest

import (
	"context"
	"fmt"
	"strings"

	"github.com/jackc/pgx/v5"
)

// RequirePasswords makes a throwaway server ask every role but the superuser
// postgres for a password (scram-sha-256 over TCP), so that tests can meet
// authentication failures such as a wrong password (SQLSTATE 28P01). Unix
// sockets and postgres stay trusted. It rewrites pg_hba.conf and reloads,
// so it refuses a [ModeDSN] server, and one shared by the test binaries of
// a go test (the error wraps [ErrUnsupported]): use [NewServer].
func (s *Server) RequirePasswords(ctx context.Context) error {
	if err := s.wholeServer("RequirePasswords on"); err != nil {
		return err
	}
	conn, err := pgx.Connect(ctx, s.adminDSN)
	if err != nil {
		return err
	}
	defer conn.Close(context.WithoutCancel(ctx))
	var hba string
	if err := conn.QueryRow(ctx, "show hba_file").Scan(&hba); err != nil {
		return err
	}
	// Clients reach a container from its network's gateway, not loopback:
	// there, trust postgres from anywhere (the container's port is published
	// on the host's loopback only).
	addrs := []string{"127.0.0.1/32", "::1/128"}
	if s.mode == ModeDocker {
		addrs = []string{"all"}
	}
	lines := "'local all all trust'"
	for _, a := range addrs {
		lines += ", 'host all postgres " + a + " trust'"
	}
	for _, a := range addrs {
		lines += ", 'host all all " + a + " scram-sha-256'"
	}
	if _, err := conn.Exec(ctx, "copy (select unnest(array["+lines+"])) to '"+strings.ReplaceAll(hba, "'", "''")+"'"); err != nil {
		return fmt.Errorf("pgtest: rewrite %s: %w", hba, err)
	}
	_, err = conn.Exec(ctx, "select pg_reload_conf()")
	return err
}
