package pgtest

import (
	"context"
	"errors"
	"fmt"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
)

// DB is one database on a [Server]: a test's own, made by [New] or
// [Server.NewDB], or one made by [Server.CreateDatabase] outside tests.
type DB struct {
	// Name is the database's name.
	Name string
	// DSN connects to the database as superuser.
	DSN string
	// Server is the server the database lives on.
	Server *Server
}

// Database is the type [Server.CreateDatabase] returned before it returned
// [DB].
//
// Deprecated: use [DB]; the two are the same type.
type Database = DB

// CreateDatabase makes a fresh database outside a test — for an Example
// function or a tool — a clone of the server's template (empty, or as
// [WithTemplate] or [WithMigrator] left it), or of the template of a
// [WithMigrator] among opts; other options are ignored here. Drop it with
// [DB.Drop]. In tests use [New], which also drops it.
//
// The clone may have been made ahead, while earlier tests ran (see
// [Server.NewDB]).
func (s *Server) CreateDatabase(ctx context.Context, opts ...Option) (*DB, error) {
	if ctx == nil {
		return nil, errors.New("pgtest: create database: nil context")
	}
	template, err := s.templateFor(ctx, opts)
	if err != nil {
		return nil, err
	}
	return s.pool(template).take(ctx)
}

// dbConfig is the configuration of opts alone, without the environment.
func dbConfig(opts []Option) config {
	var c config
	for _, o := range opts {
		if o != nil {
			o(&c)
		}
	}
	return c
}

// clone makes a new database of this run from template.
func (s *Server) clone(ctx context.Context, template string) (*DB, error) {
	name := s.dbName(randomHex(6))
	sql := "create database " + pgx.Identifier{name}.Sanitize() + " template " + pgx.Identifier{template}.Sanitize()
	if s.version >= 150000 && s.mode != ModeDSN {
		// FILE_COPY copies a small template as fast as, or faster than,
		// the default WAL_LOG strategy, which writes every page to WAL.
		// It also forces two checkpoints per database: fine on a
		// throwaway server, not on one that others use (PGTEST_DSN),
		// which keeps the default.
		sql += " strategy file_copy"
	}
	if err := s.adminExec(ctx, sql); err != nil {
		return nil, fmt.Errorf("pgtest: create database: %w", explainCreate(err))
	}
	return &DB{Name: name, DSN: s.ConnString(name), Server: s}, nil
}

// explainCreate names the cause of a CREATE DATABASE a role may not run.
func explainCreate(err error) error {
	var pe *pgconn.PgError
	if errors.As(err, &pe) && pe.Code == "42501" {
		return fmt.Errorf("%w (pgtest needs a superuser, or a role with CREATEDB)", err)
	}
	return err
}

// Drop drops the database, terminating any sessions still connected to it.
func (d *DB) Drop(ctx context.Context) error {
	if d == nil || d.Server == nil {
		return errors.New("pgtest: drop: no database")
	}
	if ctx == nil {
		return errors.New("pgtest: drop: nil context")
	}
	return d.Server.dropDatabase(ctx, d.Name)
}

func (s *Server) dropDatabase(ctx context.Context, name string) error {
	if err := s.adminExec(ctx, s.dropSQL(name)); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}

func (s *Server) dropSQL(name string) string {
	sql := "drop database if exists " + pgx.Identifier{name}.Sanitize()
	if s.version >= 130000 {
		sql += " with (force)"
	}
	return sql
}

func (s *Server) dropWith(ctx context.Context, conn *pgx.Conn, name string) error {
	if _, err := conn.Exec(ctx, s.dropSQL(name)); err != nil {
		return fmt.Errorf("pgtest: drop database %s: %w", name, err)
	}
	return nil
}
