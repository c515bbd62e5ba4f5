package pgtest

import (
	"context"
	"errors"
)

func startDocker(ctx context.Context, cfg config) (*Server, error) { return nil, errors.New("todo") }
func startLocal(ctx context.Context, cfg config) (*Server, error)  { return nil, errors.New("todo") }
