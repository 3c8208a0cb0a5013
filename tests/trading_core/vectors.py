"""Spec byte vectors, written out by hand field by field from the published message tables.

Each vector is wire bytes built from literal hex, one line per spec field (offset and meaning in
the comment), next to the record the codec must decode them to. Nothing here calls a codec.
"""

from __future__ import annotations

from tailsight.trading_core import itch

H = bytes.fromhex

# --- Nasdaq TotalView-ITCH 5.0 -------------------------------------------------------------

ITCH_SYSTEM_EVENT = b"".join(
    [
        b"S",  # 0  Message Type "S" (1.1 System Event)
        H("00 00"),  # 1  Stock Locate = 0 (always 0 for system events)
        H("00 00"),  # 3  Tracking Number = 0
        H("0d 18 c2 e2 80 00"),  # 5  Timestamp = 14,400,000,000,000 ns (04:00:00)
        b"O",  # 11 Event Code "O" = Start of Messages
    ]
)

ITCH_STOCK_DIRECTORY = b"".join(
    [
        b"R",  # 0  Message Type "R" (1.2.1 Stock Directory)
        H("00 0c"),  # 1  Stock Locate = 12
        H("00 00"),  # 3  Tracking Number = 0
        H("0d 18 c2 e2 80 00"),  # 5  Timestamp = 04:00:00
        b"AAPL    ",  # 11 Stock, right padded with spaces
        b"Q",  # 19 Market Category = Global Select
        b"N",  # 20 Financial Status Indicator = Normal
        H("00 00 00 64"),  # 21 Round Lot Size = 100
        b"N",  # 25 Round Lots Only = N
        b"C",  # 26 Issue Classification = Common Stock
        b"Z ",  # 27 Issue Sub-Type (2 alpha) "Z" padded
        b"P",  # 29 Authenticity = Live/Production
        b"N",  # 30 Short Sale Threshold Indicator = N
        b"N",  # 31 IPO Flag = N
        b"1",  # 32 LULD Reference Price Tier = 1
        b"N",  # 33 ETP Flag = N
        H("00 00 00 00"),  # 34 ETP Leverage Factor = 0
        b"N",  # 38 Inverse Indicator = N
    ]
)

ITCH_STOCK_TRADING_ACTION = b"".join(
    [
        b"H",  # 0  Message Type "H" (1.2.2)
        H("00 0c"),  # 1  Stock Locate = 12
        H("00 07"),  # 3  Tracking Number = 7
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp = 34,200,000,000,000 ns (09:30:00)
        b"AAPL    ",  # 11 Stock
        b"T",  # 19 Trading State = Trading
        b" ",  # 20 Reserved (a space)
        b"    ",  # 21 Reason (4 alpha), blank when trading resumes
    ]
)

ITCH_MWCB_DECLINE_LEVEL = b"".join(
    [
        b"V",  # 0  Message Type "V" (1.2.5.1)
        H("00 00"),  # 1  Stock Locate = 0
        H("00 00"),  # 3  Tracking Number = 0
        H("0d 18 c2 e2 80 00"),  # 5  Timestamp = 04:00:00
        H("00 00 00 51 7e 5c 8d 4e"),  # 11 Level 1, Price(8) = 3500.12345678
        H("00 00 00 48 b9 40 d4 35"),  # 19 Level 2, Price(8) = 3123.45678901
        H("00 00 00 3e dd 41 0c 00"),  # 27 Level 3, Price(8) = 2700.00000000
    ]
)

ITCH_LULD_AUCTION_COLLAR = b"".join(
    [
        b"J",  # 0  Message Type "J" (1.2.7)
        H("00 0c"),  # 1  Stock Locate = 12
        H("00 00"),  # 3  Tracking Number
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp = 09:30:00
        b"AAPL    ",  # 11 Stock
        H("00 16 e3 60"),  # 19 Auction Collar Reference Price, Price(4) = 150.0000
        H("00 19 2d 50"),  # 23 Upper Auction Collar Price = 165.0000
        H("00 14 99 70"),  # 27 Lower Auction Collar Price = 135.0000
        H("00 00 00 01"),  # 31 Auction Collar Extension = 1
    ]
)

ITCH_REG_SHO = b"".join(
    [
        b"Y",  # 0  Message Type "Y" (1.2.3 Reg SHO Short Sale Price Test Restricted Indicator)
        H("00 0c"),  # 1  Stock Locate = 12
        H("00 00"),  # 3  Tracking Number
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp = 09:30:00
        b"AAPL    ",  # 11 Stock
        b"1",  # 19 Reg SHO Action = restriction in effect (intra-day price drop)
    ]
)

ITCH_MARKET_PARTICIPANT_POSITION = b"".join(
    [
        b"L",  # 0  Message Type "L" (1.2.4)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp
        b"GSCO",  # 11 MPID (4 alpha)
        b"AAPL    ",  # 15 Stock
        b"Y",  # 23 Primary Market Maker = Y
        b"N",  # 24 Market Maker Mode = normal
        b"A",  # 25 Market Participant State = active
    ]
)

ITCH_MWCB_STATUS = b"".join(
    [
        b"W",  # 0  Message Type "W" (1.2.5.2 MWCB Status)
        H("00 00"),  # 1  Stock Locate = 0
        H("00 00"),  # 3  Tracking Number
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp
        b"1",  # 11 Breached Level = 1
    ]
)

ITCH_QUOTING_PERIOD_UPDATE = b"".join(
    [
        b"K",  # 0  Message Type "K" (1.2.6 IPO Quoting Period Update)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp
        b"NEWCO   ",  # 11 Stock
        H("00 00 8c a0"),  # 19 IPO Quotation Release Time = 36,000 s since midnight (10:00)
        b"A",  # 23 IPO Quotation Release Qualifier = anticipated
        H("00 1b 77 40"),  # 24 IPO Price, Price(4) = 180.0000
    ]
)

ITCH_OPERATIONAL_HALT = b"".join(
    [
        b"h",  # 0  Message Type "h" (1.2.8 Operational Halt)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp
        b"AAPL    ",  # 11 Stock
        b"Q",  # 19 Market Code = Nasdaq
        b"H",  # 20 Operational Halt Action = halted
    ]
)

ITCH_ADD_ORDER = b"".join(
    [
        b"A",  # 0  Message Type "A" (1.3.1 Add Order, no MPID)
        H("00 0c"),  # 1  Stock Locate = 12
        H("12 34"),  # 3  Tracking Number = 0x1234
        H("1f 1a ce da 20 39"),  # 5  Timestamp = 34,200,000,012,345 ns
        H("00 00 00 00 07 5b cd 15"),  # 11 Order Reference Number = 123456789
        b"B",  # 19 Buy/Sell Indicator = Buy
        H("00 00 01 2c"),  # 20 Shares = 300
        b"AAPL    ",  # 24 Stock
        H("00 16 e3 60"),  # 32 Price, Price(4) = 150.0000
    ]
)

ITCH_ADD_ORDER_MPID = b"".join(
    [
        b"F",  # 0  Message Type "F" (1.3.2 Add Order with MPID)
        H("00 0c"),  # 1  Stock Locate = 12
        H("00 01"),  # 3  Tracking Number = 1
        H("1f 1a ce da 20 39"),  # 5  Timestamp = 34,200,000,012,345 ns
        H("00 00 00 00 00 00 00 2a"),  # 11 Order Reference Number = 42
        b"S",  # 19 Buy/Sell Indicator = Sell
        H("00 00 00 c8"),  # 20 Shares = 200
        b"AAPL    ",  # 24 Stock
        H("00 16 e3 c4"),  # 32 Price = 150.0100
        b"GSCO",  # 36 Attribution (MPID)
    ]
)

ITCH_ORDER_EXECUTED = b"".join(
    [
        b"E",  # 0  Message Type "E" (1.4.1)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1d 22 e5 d4 00"),  # 5  Timestamp = 34,210,000,000,000
        H("00 00 00 00 00 00 00 2a"),  # 11 Order Reference Number = 42
        H("00 00 00 64"),  # 19 Executed Shares = 100
        H("00 00 00 00 00 07 a1 20"),  # 23 Match Number = 500000
    ]
)

ITCH_ORDER_EXECUTED_WITH_PRICE = b"".join(
    [
        b"C",  # 0  Message Type "C" (1.4.2)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1d 22 e5 d4 00"),  # 5  Timestamp = 34,210,000,000,000
        H("00 00 00 00 00 00 00 2a"),  # 11 Order Reference Number = 42
        H("00 00 00 64"),  # 19 Executed Shares = 100
        H("00 00 00 00 00 00 03 e8"),  # 23 Match Number = 1000
        b"Y",  # 31 Printable = Y
        H("00 16 e2 fc"),  # 32 Execution Price = 149.9900
    ]
)

ITCH_ORDER_CANCEL = b"".join(
    [
        b"X",  # 0  Message Type "X" (1.4.3)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1d 22 e5 d4 00"),  # 5  Timestamp
        H("00 00 00 00 00 00 00 2a"),  # 11 Order Reference Number = 42
        H("00 00 00 64"),  # 19 Cancelled Shares = 100
    ]
)

ITCH_ORDER_DELETE = b"".join(
    [
        b"D",  # 0  Message Type "D" (1.4.4)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1d 22 e5 d4 00"),  # 5  Timestamp
        H("00 00 00 00 00 00 00 2a"),  # 11 Order Reference Number = 42
    ]
)

ITCH_ORDER_REPLACE = b"".join(
    [
        b"U",  # 0  Message Type "U" (1.4.5)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1d 22 e5 d4 00"),  # 5  Timestamp
        H("00 00 00 00 00 00 00 2a"),  # 11 Original Order Reference Number = 42
        H("00 00 00 00 00 00 00 2b"),  # 19 New Order Reference Number = 43
        H("00 00 01 2c"),  # 27 Shares = 300
        H("00 16 e3 c4"),  # 31 Price = 150.0100
    ]
)

ITCH_TRADE = b"".join(
    [
        b"P",  # 0  Message Type "P" (1.5.1 Trade, non-cross)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1d 22 e5 d4 00"),  # 5  Timestamp
        H("00 00 00 00 00 00 00 00"),  # 11 Order Reference Number = 0 (hidden order)
        b"B",  # 19 Buy/Sell Indicator
        H("00 00 00 64"),  # 20 Shares = 100
        b"AAPL    ",  # 24 Stock
        H("00 16 e3 60"),  # 32 Price = 150.0000
        H("00 00 00 00 49 96 02 d2"),  # 36 Match Number = 1234567890
    ]
)

ITCH_CROSS_TRADE = b"".join(
    [
        b"Q",  # 0  Message Type "Q" (1.5.2 Cross Trade)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp = 09:30:00
        H("00 00 00 3a 35 29 44 00"),  # 11 Shares (8 bytes) = 250,000,000,000
        b"AAPL    ",  # 19 Stock
        H("00 16 e3 60"),  # 27 Cross Price = 150.0000
        H("00 00 00 00 00 00 03 e8"),  # 31 Match Number = 1000
        b"O",  # 39 Cross Type = Opening Cross
    ]
)

ITCH_BROKEN_TRADE = b"".join(
    [
        b"B",  # 0  Message Type "B" (1.5.3)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1d 22 e5 d4 00"),  # 5  Timestamp
        H("00 00 00 00 49 96 02 d2"),  # 11 Match Number = 1234567890
    ]
)

ITCH_NOII = b"".join(
    [
        b"I",  # 0  Message Type "I" (1.6 NOII)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp
        H("00 00 00 00 00 07 a1 20"),  # 11 Paired Shares = 500000
        H("00 00 00 00 00 00 03 e8"),  # 19 Imbalance Shares = 1000
        b"B",  # 27 Imbalance Direction = buy imbalance
        b"AAPL    ",  # 28 Stock
        H("00 16 e3 c4"),  # 36 Far Price = 150.0100
        H("00 16 e3 60"),  # 40 Near Price = 150.0000
        H("00 16 e2 fc"),  # 44 Current Reference Price = 149.9900
        b"O",  # 48 Cross Type = Opening
        b"L",  # 49 Price Variation Indicator = less than 1%
    ]
)

ITCH_RPII = b"".join(
    [
        b"N",  # 0  Message Type "N" (1.7 RPII)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp
        b"AAPL    ",  # 11 Stock
        b"B",  # 19 Interest Flag = RPI orders available on the buy side
    ]
)

ITCH_DLCR = b"".join(
    [
        b"O",  # 0  Message Type "O" (1.8 Direct Listing with Capital Raise)
        H("00 0c"),  # 1  Stock Locate
        H("00 00"),  # 3  Tracking Number
        H("1f 1a ce d9 f0 00"),  # 5  Timestamp
        b"NEWCO   ",  # 11 Stock
        b"Y",  # 19 Open Eligibility Status = Eligible
        H("00 12 4f 80"),  # 20 Minimum Allowable Price = 120.0000
        H("00 24 9f 00"),  # 24 Maximum Allowable Price = 240.0000
        H("00 1b 77 40"),  # 28 Near Execution Price = 180.0000
        H("00 00 1f 1d 22 e5 d4 00"),  # 32 Near Execution Time (8 bytes) = 34,210,000,000,000
        H("00 15 f9 00"),  # 40 Lower Price Range Collar = 144.0000
        H("00 20 f5 80"),  # 44 Upper Price Range Collar = 216.0000
    ]
)

T_0400 = 14_400_000_000_000
T_0930 = 34_200_000_000_000
T_EXEC = 34_210_000_000_000

ITCH_VECTORS: list[tuple[bytes, itch.Message]] = [
    (ITCH_SYSTEM_EVENT, itch.SystemEvent(0, 0, T_0400, "O")),
    (
        ITCH_STOCK_DIRECTORY,
        itch.StockDirectory(
            12, 0, T_0400, "AAPL", "Q", "N", 100, "N", "C", "Z", "P", "N", "N", "1", "N", 0, "N"
        ),
    ),
    (ITCH_STOCK_TRADING_ACTION, itch.StockTradingAction(12, 7, T_0930, "AAPL", "T", " ", "")),
    (
        ITCH_MWCB_DECLINE_LEVEL,
        itch.MWCBDeclineLevel(0, 0, T_0400, 350012345678, 312345678901, 270000000000),
    ),
    (
        ITCH_LULD_AUCTION_COLLAR,
        itch.LULDAuctionCollar(12, 0, T_0930, "AAPL", 1_500_000, 1_650_000, 1_350_000, 1),
    ),
    (
        ITCH_ADD_ORDER,
        itch.AddOrder(12, 0x1234, 34_200_000_012_345, 123456789, "B", 300, "AAPL", 1_500_000),
    ),
    (
        ITCH_ADD_ORDER_MPID,
        itch.AddOrderMPID(12, 1, 34_200_000_012_345, 42, "S", 200, "AAPL", 1_500_100, "GSCO"),
    ),
    (ITCH_ORDER_EXECUTED, itch.OrderExecuted(12, 0, T_EXEC, 42, 100, 500000)),
    (
        ITCH_ORDER_EXECUTED_WITH_PRICE,
        itch.OrderExecutedWithPrice(12, 0, T_EXEC, 42, 100, 1000, "Y", 1_499_900),
    ),
    (ITCH_ORDER_CANCEL, itch.OrderCancel(12, 0, T_EXEC, 42, 100)),
    (ITCH_ORDER_DELETE, itch.OrderDelete(12, 0, T_EXEC, 42)),
    (ITCH_ORDER_REPLACE, itch.OrderReplace(12, 0, T_EXEC, 42, 43, 300, 1_500_100)),
    (ITCH_TRADE, itch.Trade(12, 0, T_EXEC, 0, "B", 100, "AAPL", 1_500_000, 1234567890)),
    (
        ITCH_CROSS_TRADE,
        itch.CrossTrade(12, 0, T_0930, 250_000_000_000, "AAPL", 1_500_000, 1000, "O"),
    ),
    (ITCH_BROKEN_TRADE, itch.BrokenTrade(12, 0, T_EXEC, 1234567890)),
    (
        ITCH_NOII,
        itch.NOII(
            12, 0, T_0930, 500000, 1000, "B", "AAPL", 1_500_100, 1_500_000, 1_499_900, "O", "L"
        ),
    ),
    (ITCH_RPII, itch.RPII(12, 0, T_0930, "AAPL", "B")),
    (
        ITCH_DLCR,
        itch.DirectListingWithCapitalRaise(
            12,
            0,
            T_0930,
            "NEWCO",
            "Y",
            1_200_000,
            2_400_000,
            1_800_000,
            T_EXEC,
            1_440_000,
            2_160_000,
        ),
    ),
    (ITCH_REG_SHO, itch.RegSHORestriction(12, 0, T_0930, "AAPL", "1")),
    (
        ITCH_MARKET_PARTICIPANT_POSITION,
        itch.MarketParticipantPosition(12, 0, T_0930, "GSCO", "AAPL", "Y", "N", "A"),
    ),
    (ITCH_MWCB_STATUS, itch.MWCBStatus(0, 0, T_0930, "1")),
    (
        ITCH_QUOTING_PERIOD_UPDATE,
        itch.QuotingPeriodUpdate(12, 0, T_0930, "NEWCO", 36_000, "A", 1_800_000),
    ),
    (ITCH_OPERATIONAL_HALT, itch.OperationalHalt(12, 0, T_0930, "AAPL", "Q", "H")),
]

# Total lengths from the spec tables (offset of the last field + its length), per type byte.
ITCH_SPEC_LENGTHS: dict[bytes, int] = {
    b"S": 12, b"R": 39, b"H": 25, b"Y": 20, b"L": 26, b"V": 35, b"W": 12, b"K": 28,
    b"J": 35, b"h": 21, b"A": 36, b"F": 40, b"E": 31, b"C": 36, b"X": 23, b"D": 19,
    b"U": 35, b"P": 44, b"Q": 40, b"B": 19, b"I": 50, b"N": 20, b"O": 48,
}  # fmt: skip

# --- MoldUDP64 1.0 ----------------------------------------------------------------------------

MOLD_PACKET_TWO_MESSAGES = b"".join(
    [
        b"SESSION001",  # 0  Session (10 alpha)
        H("00 00 00 00 00 00 00 01"),  # 10 Sequence Number = 1 (of the first message)
        H("00 02"),  # 18 Message Count = 2
        H("00 0c"),  # 20 Message Length = 12
        ITCH_SYSTEM_EVENT,  # 22 Message Data
        H("00 13"),  # 34 Message Length = 19
        ITCH_ORDER_DELETE,  # 36 Message Data
    ]
)

MOLD_HEARTBEAT = b"".join(
    [
        b"SESSION001",  # 0  Session
        H("00 00 00 00 00 00 00 2a"),  # 10 Sequence Number = 42, the next message to come
        H("00 00"),  # 18 Message Count = 0: heartbeat
    ]
)

MOLD_END_OF_SESSION = b"".join(
    [
        b"SESSION001",  # 0  Session
        H("00 00 00 00 00 00 03 e8"),  # 10 Sequence Number = 1000
        H("ff ff"),  # 18 Message Count = 0xFFFF: end of session
    ]
)

MOLD_REQUEST = b"".join(
    [
        b"SESSION001",  # 0  Session
        H("00 00 00 00 00 00 00 04"),  # 10 Sequence Number = 4, first message wanted
        H("00 03"),  # 18 Requested Message Count = 3
    ]
)

# --- SoupBinTCP 4.1 ---------------------------------------------------------------------------

SOUP_LOGIN_REQUEST = b"".join(
    [
        H("00 2f"),  # Packet Length = 47 (type + 46 payload bytes)
        b"L",  # Packet Type "L" Login Request
        b"trader",  # Username (6 alpha)
        b"s3cret    ",  # Password (10 alpha, padded on the right)
        b" " * 10,  # Requested Session: all blanks = the currently active session
        b" " * 19 + b"1",  # Requested Sequence Number (20 numeric, padded on the left) = 1
    ]
)

SOUP_LOGIN_ACCEPTED = b"".join(
    [
        H("00 1f"),  # Packet Length = 31
        b"A",  # Packet Type "A" Login Accepted
        b"    ABC123",  # Session (10 alpha, padded on the left)
        b" " * 16 + b"1001",  # Sequence Number (20 numeric) = 1001, the next one to be sent
    ]
)

SOUP_LOGIN_REJECTED = H("00 02") + b"J" + b"S"  # Length 2, "J", reason "S" session unavailable
SOUP_SERVER_HEARTBEAT = H("00 01") + b"H"  # Length 1, no payload
SOUP_END_OF_SESSION = H("00 01") + b"Z"
SOUP_CLIENT_HEARTBEAT = H("00 01") + b"R"
SOUP_LOGOUT_REQUEST = H("00 01") + b"O"
SOUP_DEBUG = H("00 06") + b"+" + b"hello"  # Length 6 = type + 5 text bytes
SOUP_SEQUENCED_DATA = H("00 0b") + b"S" + b"0123456789"  # Length 11, a 10-byte message
SOUP_UNSEQUENCED_DATA = H("00 04") + b"U" + b"abc"

# --- OUCH 5.0 -----------------------------------------------------------------------------
# Offsets are within the OUCH message (the SoupBinTCP packet payload).

OUCH_ENTER_ORDER = b"".join(
    [
        b"O",  # 0  Type "O" (2.1 Enter Order)
        H("00 00 00 07"),  # 1  UserRefNum = 7
        b"B",  # 5  Side = Buy
        H("00 00 01 2c"),  # 6  Quantity = 300
        b"AAPL    ",  # 10 Symbol (8 alpha)
        H("00 00 00 00 00 16 e3 c4"),  # 18 Price (8 bytes, 4 decimals) = 150.0100
        b"0",  # 26 Time In Force = Day
        b"Y",  # 27 Display = Visible
        b"A",  # 28 Capacity = Agency
        b"N",  # 29 InterMarket Sweep Eligibility = not eligible
        b"N",  # 30 CrossType = continuous market
        b"ORDER-0000007 ",  # 31 ClOrdID (14 alpha)
        H("00 16"),  # 45 Appendage Length = 22
        H("05 02") + b"GSCO",  # 47 TagValue: length 5, tag 2 Firm = "GSCO"
        H("05 03 00 00 00 64"),  # 53 TagValue: length 5, tag 3 MinQty = 100
        H("05 07 ff ff ff 9c"),  # 59 TagValue: length 5, tag 7 PegOffset = -100 (signed)
        H("03 63 01 02"),  # 65 TagValue: length 3, tag 99 (not in Appendix A), raw 01 02
    ]
)

OUCH_REPLACE_ORDER = b"".join(
    [
        b"U",  # 0  Type "U" (2.2 Replace Order)
        H("00 00 00 07"),  # 1  OrigUserRefNum = 7
        H("00 00 00 08"),  # 5  UserRefNum = 8
        H("00 00 00 c8"),  # 9  Quantity = 200
        H("00 00 00 00 00 16 e3 60"),  # 13 Price = 150.0000
        b"0",  # 21 Time In Force = Day
        b"Y",  # 22 Display
        b"N",  # 23 InterMarket Sweep Eligibility
        b"ORDER-0000008 ",  # 24 ClOrdID
        H("00 00"),  # 38 Appendage Length = 0
    ]
)

OUCH_CANCEL_ORDER = b"".join(
    [
        b"X",  # 0  Type "X" (2.3 Cancel Order)
        H("00 00 00 08"),  # 1  UserRefNum = 8
        H("00 00 00 00"),  # 5  Quantity = 0: cancel all
        H("00 00"),  # 9  Appendage Length = 0
    ]
)

OUCH_MODIFY_ORDER = b"".join(
    [
        b"M",  # 0  Type "M" (2.4 Modify Order)
        H("00 00 00 08"),  # 1  UserRefNum = 8
        b"T",  # 5  Side = sell short
        H("00 00 00 64"),  # 6  Quantity = 100
        H("00 00"),  # 10 Appendage Length = 0
    ]
)

OUCH_ACCOUNT_QUERY_REQUEST = b"Q" + H("00 00")  # 2.8: Type, Appendage Length = 0

OUCH_SYSTEM_EVENT = b"".join(
    [
        b"S",  # 0  Type "S" (3.1 System Event)
        H("00 00 1f 1a ce da 20 39"),  # 1  Timestamp (8) = 34,200,000,012,345 ns
        b"S",  # 9  Event Code = start of day
    ]
)

OUCH_ORDER_ACCEPTED = b"".join(
    [
        b"A",  # 0  Type "A" (3.2 Order Accepted)
        H("00 00 1f 1a ce da 20 39"),  # 1  Timestamp = 34,200,000,012,345 ns
        H("00 00 00 07"),  # 9  UserRefNum = 7
        b"B",  # 13 Side
        H("00 00 01 2c"),  # 14 Quantity = 300
        b"AAPL    ",  # 18 Symbol
        H("00 00 00 00 00 16 e3 c4"),  # 26 Price = 150.0100
        b"0",  # 34 Time In Force
        b"Y",  # 35 Display
        H("00 00 00 00 07 5b cd 15"),  # 36 Order Reference Number = 123456789
        b"A",  # 44 Capacity
        b"N",  # 45 InterMarket Sweep Eligibility
        b"N",  # 46 CrossType
        b"L",  # 47 Order State = Live
        b"ORDER-0000007 ",  # 48 ClOrdID
        H("00 06"),  # 62 Appendage Length = 6
        H("05 02") + b"GSCO",  # 64 TagValue: Firm = "GSCO"
    ]
)

OUCH_ORDER_REPLACED = b"".join(
    [
        b"U",  # 0  Type "U" (3.3 Order Replaced)
        H("00 00 1f 1a ce da 20 39"),  # 1  Timestamp
        H("00 00 00 07"),  # 9  OrigUserRefNum = 7
        H("00 00 00 08"),  # 13 UserRefNum = 8
        b"B",  # 17 Side
        H("00 00 00 c8"),  # 18 Quantity = 200
        b"AAPL    ",  # 22 Symbol
        H("00 00 00 00 00 16 e3 60"),  # 30 Price = 150.0000
        b"0",  # 38 Time In Force
        b"Y",  # 39 Display
        H("00 00 00 00 07 5b cd 16"),  # 40 Order Reference Number = 123456790
        b"A",  # 48 Capacity
        b"N",  # 49 InterMarket Sweep Eligibility
        b"N",  # 50 CrossType
        b"L",  # 51 Order State
        b"ORDER-0000008 ",  # 52 ClOrdID
        H("00 00"),  # 66 Appendage Length = 0
    ]
)

OUCH_ORDER_CANCELED = b"".join(
    [
        b"C",  # 0  Type "C" (3.4 Order Canceled)
        H("00 00 1f 1a ce da 20 39"),  # 1  Timestamp
        H("00 00 00 08"),  # 9  UserRefNum = 8
        H("00 00 00 c8"),  # 13 Quantity (decrement) = 200
        b"U",  # 17 Reason = user requested
        H("00 00"),  # 18 Appendage Length = 0
    ]
)

OUCH_ORDER_EXECUTED = b"".join(
    [
        b"E",  # 0  Type "E" (3.6 Order Executed)
        H("00 00 1f 1a ce da 20 39"),  # 1  Timestamp
        H("00 00 00 07"),  # 9  UserRefNum = 7
        H("00 00 00 64"),  # 13 Quantity = 100
        H("00 00 00 00 00 16 e3 c4"),  # 17 Price = 150.0100
        b"A",  # 25 Liquidity Flag = added
        H("00 00 00 00 00 00 03 e8"),  # 26 Match Number = 1000
        H("00 00"),  # 34 Appendage Length = 0
    ]
)

OUCH_ORDER_REJECTED = b"".join(
    [
        b"J",  # 0  Type "J" (3.8 Rejected)
        H("00 00 1f 1a ce da 20 39"),  # 1  Timestamp
        H("00 00 00 09"),  # 9  UserRefNum = 9
        H("00 17"),  # 13 Reason (2-byte integer) = 0x17 Invalid Symbol
        b"ORDER-0000009 ",  # 15 ClOrdID
        H("00 00"),  # 29 Appendage Length = 0
    ]
)

OUCH_ORDER_CANCELED_WITHOUT_APPENDAGE_LENGTH = OUCH_ORDER_CANCELED[:-2]
