"""The offline sites' seed data: a shop catalog with customers and orders, and a forum.

Pure data, built deterministically (a fixed seed), so task generators (envhub/envs/webnav/
offline_tasks.py) can compute reference answers from the same rows the sites serve.
"""

from __future__ import annotations

import functools
import random
from dataclasses import dataclass

SEED = 20240611
SESSION_CUSTOMER_ID = 1
"""The shop customer every session is logged in as."""
SESSION_USER = "MarvelsGrantMan136"
"""The forum user every session is logged in as."""
ORDER_STATUSES = ("pending", "processing", "shipped", "complete", "canceled")

CATEGORIES = {
    "electronics": ("Electronics", (
        "Wireless Optical Mouse", "USB-C Charging Cable 6ft", "Bluetooth Over-Ear Headphones",
        "Portable Power Bank 10000mAh", "Mechanical Keyboard", "HD Webcam 1080p", "Smart LED Bulb 4-Pack",
        "Noise Cancelling Earbuds")),
    "kitchen": ("Kitchen", (
        "Stainless Steel Chef Knife", "Nonstick Frying Pan 10in", "Glass Food Storage Set", "Electric Kettle 1.7L",
        "Bamboo Cutting Board", "Silicone Baking Mat", "Cast Iron Skillet")),
    "home-office": ("Home Office", (
        "Ergonomic Office Chair", "Adjustable Desk Lamp", "Wireless Printer", "Ballpoint Pens 12-Pack",
        "Spiral Notebook A5", "Monitor Stand Riser")),
    "outdoor": ("Outdoor", (
        "Camping Tent for 2", "Insulated Water Bottle", "Hiking Backpack 40L", "LED Headlamp", "Folding Camp Chair")),
    "beauty": ("Beauty", (
        "Vitamin C Serum", "Moisturizing Face Cream", "Argan Oil Shampoo", "SPF 50 Sunscreen", "Bamboo Hair Brush",
        "Lavender Hand Soap")),
    "grocery": ("Grocery", (
        "Organic Green Tea 100 Bags", "Dark Roast Coffee Beans 2lb", "Raw Wildflower Honey", "Extra Virgin Olive Oil")),
}
CUSTOMERS = (
    ("Emma Lopez", "Seattle"), ("Liam Chen", "Austin"), ("Olivia Smith", "Boston"), ("Noah Patel", "Denver"),
    ("Ava Johnson", "Chicago"), ("Lucas Brown", "Portland"), ("Mia Garcia", "Miami"), ("Ethan Kim", "Phoenix"),
    ("Sophia Rossi", "Atlanta"), ("James Walker", "Dallas"), ("Isabella Nguyen", "San Diego"),
    ("Mason Clark", "Detroit"),
)
FORUMS = {
    "books": ("Books", "Reviews, recommendations and reading lists."),
    "gaming": ("Gaming", "Video games, board games and everything in between."),
    "cooking": ("Cooking", "Recipes, techniques and kitchen disasters."),
    "hiking": ("Hiking", "Trails, gear and trip reports."),
    "technology": ("Technology", "Gadgets, software and the news around them."),
}
POST_TITLES = {
    "books": ("What are you reading this month?", "Underrated science fiction from the 70s",
              "Is the audiobook as good as the paper version?", "Best book club picks for beginners",
              "Finished my first 1000-page novel"),
    "gaming": ("Which co-op game should we play next?", "Speedrunning tips for beginners",
               "Board game night essentials", "The soundtrack that made the game", "Retro console restoration log"),
    "cooking": ("Foolproof sourdough starter", "How do you keep pasta from sticking?", "Weeknight curry in 30 minutes",
                "Cast iron care myths", "Favorite pancake recipe"),
    "hiking": ("Best day hikes near Seattle", "How heavy is your pack?", "Blister prevention that actually works",
               "First solo overnight trip report", "Trekking poles: worth it?"),
    "technology": ("Mechanical keyboards for programmers", "Is 8GB of RAM still enough?", "Home network upgrade advice",
                   "Open source alternatives to popular apps", "Battery life tips for old laptops"),
}
USERS = (SESSION_USER, "bookworm_ann", "pixel_pete", "trail_tom", "chef_lina", "gadget_gus", "quiet_reader",
         "summit_sara", "dice_roller", "byte_bella")
COMMENT_TEXTS = ("Great point, thanks for sharing.", "I had the same experience.", "Could you post more details?",
                 "This helped me a lot.", "I respectfully disagree.", "Bookmarking this for later.",
                 "Has anyone tried the alternative?", "Welcome to the forum!")
DESCRIPTION_NOTES = ("Customers love its build quality.", "A best seller this season.",
                     "Backed by a two-year warranty.", "Ships in recyclable packaging.", "Rated highly for value.")


@dataclass(frozen=True)
class Product:
    sku: str
    name: str
    category: str
    price_cents: int
    description: str
    rating: float
    review_count: int
    stock: int


@dataclass(frozen=True)
class Order:
    id: int
    customer_id: int
    created: str
    status: str
    items: tuple[tuple[str, int], ...]
    """(sku, quantity) pairs; the price is the product's."""
    total_cents: int


@dataclass(frozen=True)
class Post:
    id: int
    forum: str
    author: str
    title: str
    body: str
    created: str
    score: int


@dataclass(frozen=True)
class Comment:
    id: int
    post_id: int
    author: str
    body: str


@dataclass(frozen=True)
class SeedData:
    """Everything the sites start with; one value per process."""

    products: tuple[Product, ...]
    orders: tuple[Order, ...]
    posts: tuple[Post, ...]
    comments: tuple[Comment, ...]

    def product(self, sku: str) -> Product:
        return next(product for product in self.products if product.sku == sku)

    def post(self, post_id: int) -> Post:
        return next(post for post in self.posts if post.id == post_id)


def dollars(cents: int) -> str:
    """'$12.99' for 1299: how every page shows a price."""
    return f"${cents // 100:,}.{cents % 100:02d}"


@functools.cache
def seed_data() -> SeedData:
    rng = random.Random(SEED)
    products = _products(rng)
    orders = _orders(rng, products)
    posts = _posts(rng)
    return SeedData(products, orders, posts, _comments(rng, posts))


def _products(rng: random.Random) -> tuple[Product, ...]:
    products = []
    for slug, (_, names) in CATEGORIES.items():
        for name in names:
            sku = f"{slug[:3].upper()}-{len(products) + 101}"
            price_cents = rng.randrange(4, 160) * 100 + rng.choice((49, 95, 99))
            description = f"{name} from the {CATEGORIES[slug][0].lower()} range. {rng.choice(DESCRIPTION_NOTES)}"
            products.append(Product(sku, name, slug, price_cents, description, round(rng.uniform(3.0, 5.0), 1),
                                    rng.randrange(0, 240), rng.randrange(0, 60)))
    return tuple(products)


def _orders(rng: random.Random, products: tuple[Product, ...]) -> tuple[Order, ...]:
    prices = {product.sku: product.price_cents for product in products}
    orders = []
    for index in range(40):
        order_id = 1001 + index
        # Every fifth order is the session customer's, so "my orders" has history to ask about.
        customer_id = SESSION_CUSTOMER_ID if index % 5 == 0 else 1 + rng.randrange(len(CUSTOMERS))
        skus = rng.sample(sorted(prices), rng.randrange(1, 4))
        items = tuple((sku, rng.randrange(1, 4)) for sku in skus)
        created = f"2023-{1 + index * 11 // 40:02d}-{rng.randrange(1, 29):02d}"
        total = sum(prices[sku] * qty for sku, qty in items)
        orders.append(Order(order_id, customer_id, created, rng.choice(ORDER_STATUSES), items, total))
    return tuple(orders)


def _posts(rng: random.Random) -> tuple[Post, ...]:
    posts = []
    for forum, titles in POST_TITLES.items():
        for title in titles:
            author = rng.choice(USERS[1:])
            body = f"{title} - {author} here. {rng.choice(COMMENT_TEXTS)} Curious what the {forum} crowd thinks."
            created = f"2023-{rng.randrange(1, 13):02d}-{rng.randrange(1, 29):02d}"
            posts.append(Post(len(posts) + 1, forum, author, title, body, created, rng.randrange(-3, 60)))
    return tuple(posts)


def _comments(rng: random.Random, posts: tuple[Post, ...]) -> tuple[Comment, ...]:
    comments = []
    for post in posts:
        for _ in range(rng.randrange(0, 7)):
            comments.append(Comment(len(comments) + 1, post.id, rng.choice(USERS[1:]), rng.choice(COMMENT_TEXTS)))
    return tuple(comments)
