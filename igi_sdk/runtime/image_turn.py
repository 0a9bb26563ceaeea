"""Chat turns with images: where images go in a line, how a templated prompt with images becomes
engine work (text tokens fed in the engine's own batches, images evaluated through mtmd one per
step), and the position bookkeeping that M-RoPE needs.

Rules (docs/architecture.md, "Image chat"):

* **Markers.** A line with images may say where each goes with the media marker
  (``<__media__>``, :data:`vision.DEFAULT_MARKER`): then it must hold exactly one per image. A
  line without markers gets its images before the text, in order. In a line *without* images a
  marker is plain text.
* **Player text stays data.** Inside the engine an image is a private-use character
  (:data:`IMAGE_SLOT`) in the message content, removed from every player line, system prompt and
  reply first, so nothing a player types can stand for an image. Text is tokenized with
  ``Vocab.tokenize_parts`` (special tokens from the template's markup only), never by mtmd; mtmd
  only turns each image into its chunk and the model's image delimiters.
* **Positions.** Under M-RoPE an image takes ``n_tokens`` KV cells but ``n_pos`` positions. A
  session's ``tokens`` list has one entry per *position* (:data:`IMAGE_POSITION` for an image's),
  so every ``len(tokens)`` in the engine stays the next position, and ``image_cells`` counts the
  cells beyond the positions, for the context checks.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from igi_sdk.errors import InvalidImageError
from igi_sdk.runtime.image_decode import (
    DecodeCancel,
    Decoded,
    ImageBudget,
    ImageDecoder,
    fit_pixels,
)
from igi_sdk.runtime.text import Part, Vocab
from igi_sdk.runtime.vision import (
    DEFAULT_MARKER,
    ChunkInfo,
    Chunks,
    EvalResult,
    Image,
    VisionContext,
    VisionPromptError,
)

if TYPE_CHECKING:
    from igi_sdk.runtime.session import Session, Turn

IMAGE_SLOT = "\ue002"  # an image inside a message content (private use: no template writes it)
# what a session's ``tokens`` holds at an image's positions: a valid id (saves check ids), never
# fed to a model (sessions with images do not draft)
IMAGE_POSITION = 0


@dataclass(frozen=True)
class ImageInput:
    """One image of a chat line: PNG/JPEG file bytes (``data``), or raw 8-bit pixels, rows top
    to bottom, RGB (``channels=3``) or RGBA (``channels=4``, alpha dropped)."""

    data: bytes | None = None
    pixels: bytes | None = None
    width: int = 0
    height: int = 0
    channels: int = 3

    def __post_init__(self) -> None:
        if (self.data is None) == (self.pixels is None):
            raise InvalidImageError("an image is either encoded bytes (data) or raw pixels")

    @classmethod
    def from_file(cls, path: str) -> ImageInput:
        try:
            with open(path, "rb") as f:
                return cls(data=f.read())
        except OSError as e:
            raise InvalidImageError(f"cannot read image {path}: {e.strerror}") from None

    def ready(self, decoder: ImageDecoder, budget: ImageBudget | None = None,
              cancel: DecodeCancel | None = None) -> ImageInput:
        """This image as raw pixels within ``budget``: bytes decoded in ``decoder``'s worker
        (its limits refuse what would cost too much), pixels checked; both scaled down to the
        budget. Blocks the caller (never the engine thread: see the sidecar's chat)."""
        if self.data is not None:
            out = decoder.decode(self.data, budget, cancel)
        else:
            assert self.pixels is not None
            out = fit_pixels(Decoded(self.pixels, self.width, self.height, self.channels),
                             budget, decoder.limits)
        return ImageInput(pixels=out.pixels, width=out.width, height=out.height,
                          channels=out.channels)

    def open(self, vision: VisionContext) -> Image:
        """The mtmd bitmap (sizes checked before anything is decoded)."""
        if self.data is not None:
            return vision.image_from_bytes(self.data)
        assert self.pixels is not None
        return vision.image_from_pixels(self.pixels, self.width, self.height, self.channels)


def prepare(decoder: ImageDecoder, images: Sequence[ImageInput], budget: ImageBudget | None,
            cancel: DecodeCancel | None = None) -> tuple[ImageInput, ...]:
    """Every image of a line made ready (:meth:`ImageInput.ready`), in order."""
    return tuple(image.ready(decoder, budget, cancel) for image in images)


@dataclass
class PendingImage:
    """An image of a turn not evaluated yet, and the tokens that follow it up to the next."""

    input: ImageInput
    info: ChunkInfo
    index: int  # the image's chunk in ``chunks``
    after: list[int]
    chunks: Chunks | None = field(default=None, repr=False)  # freed with the vision context


def clean(text: str) -> str:
    """Text that can go through the C chat template and cannot stand for an image."""
    return text.replace("\0", "").replace(IMAGE_SLOT, "")


def user_content(text: str, n_images: int, marker: str = DEFAULT_MARKER) -> str:
    """The message content of a player line with ``n_images`` images (see the module's rules)."""
    text = clean(text)
    if n_images == 0:
        return text
    found = text.count(marker)
    if found == 0:
        return IMAGE_SLOT * n_images + text
    if found != n_images:
        raise VisionPromptError(
            f"the line has {found} media markers ({marker!r}) but {n_images} images were sent: "
            "put one marker per image, or none (the images then go before the text)")
    return text.replace(marker, IMAGE_SLOT)


def tokenize(vocab: Vocab, vision: VisionContext | None, parts: Sequence[Part],
             images: Sequence[ImageInput], *, add_special: bool
             ) -> tuple[list[int], list[PendingImage]]:
    """(tokens before the first image, the images with the tokens after each) of a templated
    prompt whose contents hold one :data:`IMAGE_SLOT` per image of ``images``, in order.

    Every image is decoded and checked here (a bad one raises before anything changes); the
    text between images is tokenized part by part as the engine does without images."""
    segments: list[list[Part]] = [[]]
    for text, markup in parts:
        pieces = [text] if markup else text.split(IMAGE_SLOT)
        segments[-1].append((pieces[0], markup))
        for piece in pieces[1:]:
            segments.append([(piece, markup)])
    if len(segments) - 1 != len(images):
        raise InvalidImageError(
            f"the conversation has {len(segments) - 1} images but {len(images)} were given")
    tokens = [vocab.tokenize_parts([p for p in seg if p[0]], add_special=add_special and i == 0)
              for i, seg in enumerate(segments)]
    if not images:
        return tokens[0], []
    assert vision is not None
    pending: list[PendingImage] = []
    try:
        for i, inp in enumerate(images):
            p = chunk(vision, inp)
            kinds = [c.kind for c in p.chunks.info] if p.chunks else []
            # mtmd's delimiters around the image (Qwen: <|vision_start|>, <|vision_end|>)
            before = [t for k in range(p.index) if kinds[k] == "text"
                      for t in p.chunks.text_tokens(k)] if p.chunks else []
            after = [t for k in range(p.index + 1, len(kinds)) if kinds[k] == "text"
                     for t in p.chunks.text_tokens(k)] if p.chunks else []
            (pending[-1].after if pending else tokens[0]).extend(before)
            p.after = after + tokens[i + 1]
            pending.append(p)
    except BaseException:
        release(pending)
        raise
    return tokens[0], pending


def chunk(vision: VisionContext, inp: ImageInput) -> PendingImage:
    """The image's chunk list (the delimiters and the image, preprocessed for the encoder)."""
    with inp.open(vision) as bitmap:
        chunks = vision.tokenize(vision.options.media_marker, [bitmap])
    kinds = [c.kind for c in chunks.info]
    if kinds.count("image") != 1:
        chunks.close()
        raise InvalidImageError(f"mtmd made {kinds} of one image")
    index = kinds.index("image")
    return PendingImage(inp, chunks.info[index], index, [], chunks)


def cells(pending: Sequence[PendingImage]) -> int:
    """KV cells the images and the tokens after them take."""
    return sum(p.info.n_tokens + len(p.after) for p in pending)


def eval_next(vision: VisionContext, lctx: object, turn: Turn, n_batch: int) -> EvalResult:
    """Evaluate the turn's next image into its session's sequence at the session's next
    position (one engine step); its tokens become the feed. On failure the sequence is cut back
    (vision.py) and the error raised: the caller rolls the turn back."""
    s, p = turn.session, turn.images[0]
    if p.chunks is None or p.chunks.closed:  # the vision context was reopened (a reshard)
        fresh = chunk(vision, p.input)
        p.chunks, p.index, p.info = fresh.chunks, fresh.index, fresh.info
    assert p.chunks is not None
    n_past = len(s.tokens)
    result = vision.eval_media(lctx, p.chunks, p.index, n_past, seq_id=s.seq, n_batch=n_batch)
    n_pos = result.n_past - n_past
    s.image_decoded(n_pos, result.n_tokens, IMAGE_POSITION)
    p.chunks.close()
    turn.images.pop(0)
    turn.feed = p.after
    return result


def release(pending: Sequence[PendingImage]) -> None:
    for p in pending:
        if p.chunks is not None:
            p.chunks.close()


@dataclass(frozen=True)
class MediaMark:
    """A session's image bookkeeping at the start of a turn (to roll it back)."""

    kept: int
    n_images: int
    image_cells: int

    @classmethod
    def of(cls, s: Session) -> MediaMark:
        return cls(len(s.images), s.n_images, s.image_cells)

    def restore(self, s: Session) -> None:
        del s.images[self.kept:]
        s.n_images, s.image_cells = self.n_images, self.image_cells
