"""The exceptions mambacpp raises. Every failure the C++ library reports is an :class:`Error`, with its message."""


class Error(RuntimeError):
    """A failure reported by mamba.cpp; the message says what was wrong, what was expected and what was found."""


class InvalidArgumentError(Error, ValueError):
    """Bad input: a wrong shape, dtype, token id, option or sampling parameter (also a ValueError)."""


class FileError(Error, OSError):
    """A file that cannot be read or written, or holds the wrong thing (another model's state, a corrupt
    checkpoint); also an OSError."""


class MissingFileError(FileError, FileNotFoundError):
    """A model directory or file that does not exist (also a FileNotFoundError)."""
