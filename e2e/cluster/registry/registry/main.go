// The registry the tests run: distribution's cmd/registry (v3.1.2, its main.go) with the drivers the tests use
// (filesystem, inmemory; htpasswd and token auth; the redirect middleware, for blobs sent to another host)
// and without the cloud storage drivers (S3, GCS, Azure, CloudFront) and the pull-through proxy, which are
// half of upstream's build (999 packages against 573; about a third of its cold build time).
package main

import (
	"github.com/distribution/distribution/v3/registry"
	_ "github.com/distribution/distribution/v3/registry/auth/htpasswd"
	_ "github.com/distribution/distribution/v3/registry/auth/token"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/filesystem"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/middleware/redirect"
)

func main() {
	// as upstream's main: the registered commands report their own errors and exit non-zero
	// nolint:errcheck
	registry.RootCmd.Execute()
}
