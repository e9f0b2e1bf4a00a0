package redlease_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/redlease/redlease"
	"github.com/redlease/redlease/internal/redistest"
	"github.com/redlease/redlease/quorum"
)

// TLS is the client's business: a go-redis client with a TLSConfig works
// with every strategy unchanged. This runs real redis-server processes with
// TLS (Debian's build has it) and a CA made for the test.
func TestStrategiesOverTLS(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	caPEM, certFile, keyFile := testCertificates(t, dir)
	pool := x509.NewCertPool()
	require.True(t, pool.AppendCertsFromPEM(caPEM))

	var clients []redis.UniversalClient
	for range 3 {
		port := redistest.FreePort(t)
		redistest.Start(t, redistest.Config{Args: []string{
			"--tls-port", strconv.Itoa(port), "--tls-cert-file", certFile, "--tls-key-file", keyFile,
			"--tls-ca-cert-file", filepath.Join(dir, "ca.pem"), "--tls-auth-clients", "no",
		}})
		c := redis.NewClient(&redis.Options{
			Addr:      net.JoinHostPort("127.0.0.1", strconv.Itoa(port)),
			TLSConfig: &tls.Config{RootCAs: pool, ServerName: "127.0.0.1", MinVersion: tls.VersionTLS12},
		})
		t.Cleanup(func() { _ = c.Close() })
		clients = append(clients, c)
	}
	ctx := t.Context()
	locker := singleLocker(t, clients[0])
	lk, err := locker.TryLock(ctx, "tls:single")
	require.NoError(t, err)
	require.NoError(t, lk.Release(ctx))

	// A node timeout of 5 s: the first grant dials two fresh TLS
	// connections, whose handshakes the default 100 ms does not cover on a
	// loaded machine (it failed so once, beside three other tests), and
	// nothing here is about the timeout.
	q, err := quorum.New(clients, quorum.WithFencing(), quorum.WithNodeTimeout(5*time.Second))
	require.NoError(t, err)
	defer q.Close()
	locker2, err := redlease.New(q)
	require.NoError(t, err)
	lk, err = locker2.TryLock(ctx, "tls:quorum")
	require.NoError(t, err)
	require.NotZero(t, lk.Fence())
	require.NoError(t, lk.Release(ctx))

	plain := redis.NewClient(&redis.Options{Addr: clients[0].(*redis.Client).Options().Addr, MaxRetries: -1, DialTimeout: 200 * time.Millisecond, ReadTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = plain.Close() })
	locker3 := singleLocker(t, plain)
	_, err = locker3.TryLock(ctx, "tls:plain")
	require.Error(t, err, "a client without TLS cannot talk to the TLS port")
}

// testCertificates writes a CA and a server certificate for 127.0.0.1.
func testCertificates(t *testing.T, dir string) (caPEM []byte, certFile, keyFile string) {
	t.Helper()
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "redlease test CA"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, KeyUsage: x509.KeyUsageCertSign, BasicConstraintsValid: true,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	require.NoError(t, err)
	caPEM = pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	srvKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	srv := &x509.Certificate{
		SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "127.0.0.1"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IPAddresses: []net.IP{net.ParseIP("127.0.0.1")},
		KeyUsage:    x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
	}
	caCert, err := x509.ParseCertificate(caDER)
	require.NoError(t, err)
	srvDER, err := x509.CreateCertificate(rand.Reader, srv, caCert, &srvKey.PublicKey, caKey)
	require.NoError(t, err)
	keyDER, err := x509.MarshalECPrivateKey(srvKey)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, "server.pem"), filepath.Join(dir, "server-key.pem")
	require.NoError(t, os.WriteFile(filepath.Join(dir, "ca.pem"), caPEM, 0o600))
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: srvDER}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}), 0o600))
	return caPEM, certFile, keyFile
}
