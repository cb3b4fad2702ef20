// Package sharegroup holds the end-to-end test of kafkadelay.ShareRetry with franz-go's share
// group consumer (kgo.ShareGroup, franz-go 1.22 and newer, which needs Go 1.26). It is a module
// of its own so that the helper (clients/go) keeps asking only for Go 1.21 and franz-go 1.18.
package sharegroup
