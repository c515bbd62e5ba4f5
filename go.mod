module github.com/pglocks/pglocks

go 1.25.0
