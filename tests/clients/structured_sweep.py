#!/usr/bin/env python3
"""Structured output through the real `openai` SDK: `client.chat.completions.parse(
response_format=<pydantic model>)` over 20 varied schemas (nested objects, arrays with
min/max items, enums, bounded numbers, optional fields, anyOf, literals, $ref'd sub-models)
against `mica serve`. Every constrained answer must parse and validate (100%); the same
requests without `response_format` (the schema only in the prompt) give the contrast rate.

usage: structured_sweep.py URL MODEL KEY [--limit N] [--only I] [--no-contrast]
Every string is bounded (maxLength), so an answer always fits in max_tokens.
Exits non-zero when a constrained answer fails to parse or validate. Prints one line per
schema and a summary `constrained: X/N valid; unconstrained: Y/N valid`.
"""

import json
import sys
from enum import Enum
from typing import Annotated, List, Literal, Optional, Union

import openai
from pydantic import BaseModel, Field, ValidationError

Name = Field(max_length=24)


class Color(str, Enum):
    red = "red"
    green = "green"
    blue = "blue"


class Person(BaseModel):
    name: str = Name
    age: int = Field(ge=0, le=120)


class Address(BaseModel):
    street: str = Field(max_length=30)
    city: str = Name
    zip: str = Field(pattern=r"^[0-9]{5}$")


class PersonWithAddress(BaseModel):
    person: Person
    address: Address


class Shopping(BaseModel):
    items: List[Annotated[str, Field(max_length=24)]] = Field(min_length=2, max_length=4)


class Paint(BaseModel):
    color: Color
    coats: int = Field(ge=1, le=3)


class Measurement(BaseModel):
    celsius: float = Field(ge=-50, le=60)
    humidity: float = Field(ge=0, le=1)


class Profile(BaseModel):
    username: str = Name
    nickname: Optional[str] = Field(default=None, max_length=12)
    verified: bool


class Circle(BaseModel):
    kind: Literal["circle"]
    radius: float = Field(ge=0, le=100)


class Square(BaseModel):
    kind: Literal["square"]
    side: float = Field(ge=0, le=100)


class Drawing(BaseModel):
    shape: Union[Circle, Square]


class Team(BaseModel):
    name: str = Name
    members: List[Person] = Field(min_length=1, max_length=3)


class Answer(BaseModel):
    answer: Literal["yes", "no", "unsure"]
    confidence: int = Field(ge=0, le=100)


class Point(BaseModel):
    x: int = Field(ge=-100, le=100)
    y: int = Field(ge=-100, le=100)


class Polyline(BaseModel):
    points: List[Point] = Field(min_length=2, max_length=4)


class Book(BaseModel):
    title: str = Field(max_length=40)
    author: str = Name
    year: int = Field(ge=1400, le=2030)
    genres: List[Literal["fiction", "science", "history", "poetry"]] = Field(min_length=1, max_length=2)


class Event(BaseModel):
    title: str = Field(max_length=30)
    day: Literal["mon", "tue", "wed", "thu", "fri", "sat", "sun"]
    hour: int = Field(ge=0, le=23)
    attendees: Optional[List[Annotated[str, Field(max_length=20)]]] = Field(default=None,
                                                                         max_length=3)


class Flags(BaseModel):
    dark_mode: bool
    notifications: bool
    language: Literal["en", "fr", "de"]


class Rating(BaseModel):
    stars: int = Field(ge=1, le=5)
    comment: Optional[str] = Field(default=None, max_length=40)


class Recipe(BaseModel):
    dish: str = Name
    servings: int = Field(ge=1, le=12)
    ingredients: List[Annotated[str, Field(max_length=30)]] = Field(min_length=2, max_length=5)
    vegetarian: bool


class Matrix(BaseModel):
    rows: List[List[int]] = Field(min_length=2, max_length=2)


class IdOrName(BaseModel):
    ref: Union[int, str]


class Inventory(BaseModel):
    sku: str = Field(pattern=r"^[A-Z]{3}-[0-9]{3}$")
    count: int = Field(ge=0, le=1000)
    color: Optional[Color] = None


class Nested(BaseModel):
    outer: "Inner"


class Inner(BaseModel):
    level: int = Field(ge=1, le=3)
    leaf: "Leaf"


class Leaf(BaseModel):
    label: str = Field(max_length=10)
    on: bool


Nested.model_rebuild()
Inner.model_rebuild()

CASES = [
    (Person, "Describe Ada Lovelace, aged 36."),
    (PersonWithAddress, "Describe Bob, 40, who lives at 1 Main St, Springfield 12345."),
    (Shopping, "A shopping list for pancakes."),
    (Paint, "How should I paint a barn?"),
    (Measurement, "Today's weather in Paris: 21 degrees, humid."),
    (Profile, "Profile of user alice99, verified, nickname Al."),
    (Drawing, "Draw a circle of radius 3."),
    (Team, "A team called Rockets with two members, Ann (30) and Joe (25)."),
    (Answer, "Is the sky blue?"),
    (Polyline, "A line through three points."),
    (Book, "Describe the novel Dune."),
    (Event, "A meeting on Tuesday at 10 with Ann and Joe."),
    (Flags, "Settings: dark mode on, notifications off, French."),
    (Rating, "Rate a good pizza."),
    (Recipe, "A recipe for tomato soup."),
    (Matrix, "The 2x2 identity matrix."),
    (IdOrName, "Refer to item 42."),
    (Inventory, "Stock of 12 red widgets, SKU ABC-123."),
    (Nested, "A nested config with level 2 and a leaf labelled 'x' that is on."),
    (Profile, "Profile of user bob, not verified, no nickname."),
]


def main():
    args = sys.argv[1:]
    url, model, key = args[0], args[1], args[2]
    limit = int(args[args.index("--limit") + 1]) if "--limit" in args else len(CASES)
    contrast = "--no-contrast" not in args
    client = openai.OpenAI(base_url=f"{url}/v1", api_key=key)
    ok = free_ok = 0
    picked = list(enumerate(CASES))[:limit]
    if "--only" in args:
        picked = [picked[int(args[args.index("--only") + 1])]]
    cases = picked
    for i, (schema, ask) in picked:
        messages = [
            {"role": "system", "content": "Answer with JSON only, following this JSON schema: "
             + json.dumps(schema.model_json_schema())},
            {"role": "user", "content": ask},
        ]
        try:
            r = client.chat.completions.parse(model=model, messages=messages,
                                              response_format=schema, temperature=0,
                                              max_tokens=400)
            parsed = r.choices[0].message.parsed
            good = isinstance(parsed, schema)
            detail = r.choices[0].message.content
        except (ValidationError, openai.LengthFinishReasonError, json.JSONDecodeError) as e:
            good, detail = False, str(e)[:200]
        ok += good
        line = f"{'ok  ' if good else 'FAIL'} {i:2} {schema.__name__:18} {detail}"
        if contrast:
            # 200 tokens hold any valid answer to these schemas with room to spare; a model
            # still writing by then is not answering with the JSON asked for.
            r = client.chat.completions.create(model=model, messages=messages, temperature=0,
                                               max_tokens=200)
            text = r.choices[0].message.content or ""
            try:
                schema.model_validate_json(text)
                free_good = True
            except ValidationError:
                free_good = False
            free_ok += free_good
            line += f" | unconstrained {'valid' if free_good else 'invalid'}"
        print(line, flush=True)
    n = len(cases)
    summary = f"{model}: constrained: {ok}/{n} valid"
    if contrast:
        summary += f"; unconstrained: {free_ok}/{n} valid ({100 * free_ok / n:.0f}%)"
    print(summary)
    sys.exit(0 if ok == n else 1)


if __name__ == "__main__":
    main()
