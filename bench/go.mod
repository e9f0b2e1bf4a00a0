module github.com/redlease/redlease/bench

go 1.26.0

require github.com/redlease/redlease v0.0.0-00010101000000-000000000000

require (
	github.com/bsm/redislock v0.9.4
	github.com/go-redsync/redsync/v4 v4.18.1
	github.com/redis/go-redis/v9 v9.23.0
	github.com/stretchr/testify v1.12.1
)

require (
	github.com/cespare/xxhash/v2 v2.3.0 // indirect
	go.uber.org/atomic v1.12.0 // indirect
	go.yaml.in/yaml/v3 v3.0.5 // indirect
	golang.org/x/sys v0.49.0 // indirect
)

// Development: the library from this repository, not a published version.
replace github.com/redlease/redlease => ../
