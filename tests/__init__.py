"""kvbook's tests: unit tests of kvlib in folders that mirror its packages, and checks of the book."""
