package redistest

import (
	"fmt"
	"net"
	"syscall"
)

// listenOwnPort listens on a free loopback port named explicitly: a socket
// bound to a port it named keeps the port while it does not listen (see
// pauseListener), where one bound to port 0 would give it back.
func listenOwnPort() (net.Listener, error) {
	var last error
	for range 10 { // the port may be taken between freePort and Listen
		port, err := freePort()
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", fmt.Sprintf("127.0.0.1:%d", port))
		if err == nil {
			return ln, nil
		}
		last = err
	}
	return nil, last
}

// pauseListener makes ln stop listening but stay bound: connections to its
// port are refused, and no other socket can bind the port (SO_REUSEADDR
// off: a bound socket that does not listen would otherwise let one).
// Accept on ln fails until resumeListener. Linux only: elsewhere it returns
// an error and leaves ln listening.
func pauseListener(ln net.Listener) error {
	return control(ln, func(fd int) error {
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 0); err != nil {
			return err
		}
		if err := syscall.Shutdown(fd, syscall.SHUT_RD); err != nil {
			_ = syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1)
			return err
		}
		return nil
	})
}

// resumeListener makes a paused ln listen again, on the port it kept.
func resumeListener(ln net.Listener) error {
	return control(ln, func(fd int) error {
		// Back on first: Linux refuses listen on the socket otherwise
		// ("address already in use").
		if err := syscall.SetsockoptInt(fd, syscall.SOL_SOCKET, syscall.SO_REUSEADDR, 1); err != nil {
			return err
		}
		return syscall.Listen(fd, syscall.SOMAXCONN)
	})
}

// control runs f on ln's socket.
func control(ln net.Listener, f func(fd int) error) error {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return fmt.Errorf("%T is not a TCP listener", ln)
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return err
	}
	var ferr error
	if err := rc.Control(func(fd uintptr) { ferr = f(int(fd)) }); err != nil {
		return err
	}
	return ferr
}
