"""The package version, in a room of its own: any room may read it without importing the
package root (whose ``install()`` reaches into the reporter)."""

__version__ = "0.1.0"
