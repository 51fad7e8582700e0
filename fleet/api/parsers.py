"""The API's JSON parser: DRF's, with a bound on nesting (see fleet.jsonsafe) and
no lone UTF-16 surrogates (JSON's "\\ud800" escape parses to a string that no
database or response can encode)."""

from __future__ import annotations

from django.conf import settings
from rest_framework.exceptions import ParseError
from rest_framework.parsers import JSONParser
from rest_framework.settings import api_settings
from rest_framework.utils import json as drf_json

from fleet import jsonsafe


class DepthLimitedJSONParser(JSONParser):
    """Parses a JSON body; 400 for malformed, non-UTF-8, too deeply nested ones, or
    ones holding a lone surrogate."""

    def parse(self, stream, media_type=None, parser_context=None):
        encoding = (parser_context or {}).get("encoding") or settings.DEFAULT_CHARSET
        try:
            text = stream.read().decode(encoding)
            parse_constant = drf_json.strict_constant if api_settings.STRICT_JSON else None
            data = jsonsafe.loads(text, settings.RACKWISE_API_MAX_JSON_DEPTH, parse_constant=parse_constant)
            drf_json.dumps(data, ensure_ascii=False).encode("utf-8")
            return data
        except UnicodeEncodeError as exc:
            raise ParseError(
                "JSON parse error - the body holds a lone UTF-16 surrogate "
                f"(\\u{ord(exc.object[exc.start]):04x}), which is not a character: "
                "escape characters outside the BMP as a surrogate pair, or send them as UTF-8"
            ) from None
        except jsonsafe.TooDeep as exc:
            raise ParseError(str(exc)) from None
        except (ValueError, UnicodeDecodeError) as exc:
            raise ParseError(f"JSON parse error - {exc}") from None
